"""detach.py: ansible-playbook keeps going when the pty of a killed service hangs up, and holds the play
lease while it lives."""

from __future__ import annotations

import os
import pty
import signal
import subprocess
import sys
import time
from pathlib import Path

from inplace_extension.plays.artifacts import PLAY_LEASE, PLAY_LEASE_ENV, play_ended
from inplace_extension.plays.runner import install_wrapper


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


def test_the_play_lease_is_held_while_ansible_playbook_lives_and_freed_when_it_is_killed(
    tmp_path: Path,
) -> None:
    """A restarted service tells a dead play from a live one by the lease (ended_lock_tokens)."""
    wrapper = install_wrapper(tmp_path / "runs")
    fake_playbook(tmp_path, tmp_path / "done")
    batch_dir = tmp_path / "batch"
    batch_dir.mkdir()
    env = {
        **os.environ,
        "PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}",
        PLAY_LEASE_ENV: str(batch_dir / PLAY_LEASE),
    }
    assert not play_ended(batch_dir)  # never started: nothing known
    with subprocess.Popen([str(wrapper), "play.yml"], env=env, stdout=subprocess.PIPE) as proc:
        assert proc.stdout is not None and proc.stdout.readline() == b"started\n"
        assert not play_ended(batch_dir)
        proc.kill()  # the wrapper dies first; ansible-playbook inherited the lease and still holds it
        proc.wait(10)
    assert not play_ended(batch_dir)
    playbook = next(
        int(pid.name)
        for pid in Path("/proc").iterdir()
        if pid.name.isdigit() and _cmdline(pid).startswith(f"{sys.executable}\0{tmp_path}/ansible-playbook")
    )
    os.kill(playbook, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while not play_ended(batch_dir):  # the kernel drops the flock once the last holder is gone
        assert time.monotonic() < deadline, "the lease stayed held after the play was killed"
        time.sleep(0.02)


def _cmdline(pid_dir: Path) -> str:
    try:
        return (pid_dir / "cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""


def test_a_fresh_answer_runs_the_play_here_even_while_the_server_still_holds_its_copy_of_the_pipe(
    tmp_path: Path,
) -> None:
    """A server that retires answers ``fresh``: it forked nothing, so the client runs ansible-playbook
    itself at once, even when the server closes the descriptors it was passed only after its answer
    (that order once made the client take the answer for a server dead mid-play: the play "killed")."""
    import array
    import socket
    import threading

    from inplace_extension.plays import detach

    path = str(tmp_path / "server.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    release = threading.Event()

    def server() -> None:
        conn, _ = listener.accept()
        fds = array.array("i")
        head, ancdata, _, _ = conn.recvmsg(4, socket.CMSG_SPACE(8 * fds.itemsize))
        for _, _, data in ancdata:
            fds.frombytes(data[: len(data) - (len(data) % fds.itemsize)])
        body = b""
        while len(body) < int.from_bytes(head, "big"):  # the whole request read, as the server does
            body += conn.recv(65536)
        conn.sendall(b"fresh\n")
        conn.close()
        release.wait(10)  # still holding the client's pipe after the answer
        for fd in fds:
            os.close(fd)

    thread = threading.Thread(target=server, daemon=True)
    thread.start()
    started = time.monotonic()
    try:
        assert detach._through_server(path, ["ansible-playbook"], {}, ()) is None
        assert time.monotonic() - started < 5, "the client waited for the server's copy of the pipe"
    finally:
        release.set()
        thread.join(10)
        listener.close()
