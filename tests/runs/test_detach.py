"""detach.py: ansible-playbook keeps going when the pty of a killed service hangs up."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
import time
from pathlib import Path

from inplace_extension.runs.runner import install_wrapper


def fake_playbook(bin_dir: Path, done: Path) -> None:
    """Stand-in ``ansible-playbook``: prints, waits for a go file, prints more, records its args."""
    script = bin_dir / "ansible-playbook"
    script.write_text(
        f"#!{sys.executable}\n"
        "import sys, time, pathlib\n"
        "print('started', flush=True)\n"
        f"go = pathlib.Path({str(done)!r} + '.go')\n"
        "deadline = time.monotonic() + 20\n"
        "while not go.exists() and time.monotonic() < deadline:\n"
        "    time.sleep(0.02)\n"
        "for _ in range(200):\n"
        "    print('x' * 100)\n"
        f"pathlib.Path({str(done)!r}).write_text(' '.join(sys.argv[1:]))\n"
        "sys.exit(3)\n"
    )
    script.chmod(0o755)


def test_output_and_exit_code_pass_through(tmp_path: Path) -> None:
    wrapper = install_wrapper(tmp_path / "runs")
    assert os.access(wrapper, os.X_OK)
    fake_playbook(tmp_path, tmp_path / "done")
    (tmp_path / "done.go").touch()
    env = {**os.environ, "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.run([str(wrapper), "site.yml", "-i", "inv"], env=env, capture_output=True, timeout=30)
    assert proc.returncode == 3
    assert proc.stdout.startswith(b"started\n")
    assert (tmp_path / "done").read_text() == "site.yml -i inv"


def test_play_outlives_the_pty_hanging_up(tmp_path: Path) -> None:
    wrapper = install_wrapper(tmp_path / "runs")
    fake_playbook(tmp_path, tmp_path / "done")
    env = {**os.environ, "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"}
    master, slave = pty.openpty()
    # like pexpect: the wrapper leads a new session on the pty
    proc = subprocess.Popen(
        [str(wrapper), "play.yml"], env=env, stdin=slave, stdout=slave, stderr=slave, start_new_session=True
    )
    os.close(slave)
    assert os.read(master, 100).startswith(b"started")
    os.close(master)  # the service died: the pty hangs up (SIGHUP, then EIO on every write)
    (tmp_path / "done.go").touch()
    deadline = time.monotonic() + 20
    while not (tmp_path / "done").exists():
        assert time.monotonic() < deadline, "the play did not finish after the hang-up"
        time.sleep(0.02)
    assert (tmp_path / "done").read_text() == "play.yml"
    assert proc.wait(10) == 3
