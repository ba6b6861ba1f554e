"""Every shell block of the docs marked ``bash doc-test`` runs as written against a fresh ``scripts/serve``.

The blocks are taken from ``README.md`` and ``docs/*.md``; each runs with ``bash -euo pipefail`` from the
checkout's top directory while the documented start command serves. The whole run happens in a network
namespace of its own (``unshare --net``: root, or an unprivileged user namespace), so the documented
fixed port 127.0.0.1:9443 cannot clash with anything else on the machine, and with a fresh
``XDG_STATE_HOME`` so the development CA is made anew, as on a first try. docs/development.md describes
the marker.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

from hostlab.pytest_plugin import required

ROOT = Path(__file__).resolve().parents[2]
DOCS = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
MARKER = "doc-test"
FENCE = re.compile(r"^```bash[ \t]+" + MARKER + r"[ \t]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
START = "scripts/serve"


def blocks() -> list[tuple[str, str]]:
    """(file:line, script) of every marked block, in document order."""
    found = []
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for match in FENCE.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            found.append((f"{doc.relative_to(ROOT)}:{line}", match.group(1)))
    return found


def isolated() -> list[str]:
    """The command prefix for a private network namespace, or a skip reason when there is none."""
    unshare = shutil.which("unshare")
    if unshare is None:
        required("a network namespace", "no unshare(1) to give the documented port 9443 one of its own")
    prefix = [unshare, "--net"] if os.geteuid() == 0 else [unshare, "--net", "--map-root-user"]
    probe = subprocess.run([*prefix, "true"], capture_output=True, text=True, check=False)
    if probe.returncode != 0:
        required("a network namespace", probe.stderr.strip())
    return prefix


# One shell inside the namespace: bring up loopback, start the service exactly as documented, wait for
# it, run each block (a failure names the block and shows its output), stop the service by its PID.
RUNNER = r"""
set -u
ip link set lo up
scripts/serve >"$DOCTEST_DIR/serve.log" 2>&1 &
serve=$!
trap 'kill "$serve" 2>/dev/null; wait "$serve" 2>/dev/null' EXIT
ca="$XDG_STATE_HOME/inplace-extension/tls/ca.crt"
for _ in $(seq 600); do
  if [ -f "$ca" ] && curl -s -o /dev/null --cacert "$ca" https://127.0.0.1:9443/healthz; then break; fi
  if ! kill -0 "$serve" 2>/dev/null; then
    echo "scripts/serve exited:"; cat "$DOCTEST_DIR/serve.log"; exit 3
  fi
  sleep 0.1
done
status=0
for block in "$DOCTEST_DIR"/block-*.sh; do
  if ! bash -euo pipefail "$block" >"$block.out" 2>&1; then
    echo "FAILED $(head -1 "$block" | cut -c3-)"; cat "$block.out"; status=1
  fi
done
exit $status
"""


def test_the_docs_mark_local_commands_and_the_readme_names_the_start_command() -> None:
    found = blocks()
    assert any(where.startswith("README.md") for where, _ in found), "README.md has no `bash doc-test` block"
    assert any(where.startswith("docs/") for where, _ in found), "no docs/ page has a `bash doc-test` block"
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert f"```bash\n{START}\n```" in readme, "the README must show the start command the doc test uses"
    assert "scripts/test" in readme, "the README names the test command that .ci/run runs"


def test_the_readme_is_short_and_shows_both_installs_on_its_first_screen() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; move detail into docs/"
    first_screen = "\n".join(lines[:50])
    assert "clusterctl init" in first_screen and "--runtime-extension inplace-extension" in first_screen
    assert "kubectl apply -f dist/mcm-agent.yaml" in first_screen


def test_every_marked_command_runs_as_written(tmp_path: Path) -> None:
    prefix = isolated()
    for index, (where, script) in enumerate(blocks()):
        (tmp_path / f"block-{index:03d}.sh").write_text(f"# {where}\n{script}", encoding="utf-8")
    state = tmp_path / "state"
    env = {
        **os.environ,
        "XDG_STATE_HOME": str(state),
        "DOCTEST_DIR": str(tmp_path),
    }
    env.pop("INPLACE_ALLOWED_CIDRS", None)
    # what scripts/serve installs first, done here, outside the namespace, where the network is
    prepared = subprocess.run(
        [ROOT / "scripts" / "bootstrap", "--serve"], cwd=ROOT, capture_output=True, text=True, check=False
    )
    assert prepared.returncode == 0, f"scripts/bootstrap --serve failed:\n{prepared.stderr}"
    result = subprocess.run(
        [*prefix, "bash", "-c", RUNNER],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, f"documented commands failed:\n{result.stdout}\n{result.stderr}"
    outputs = sorted(tmp_path.glob("block-*.sh.out"))
    assert len(outputs) == len(blocks())
    # the blocks really talked to the service, and the README's first block shows what the text after it
    # says: Discovery's handler names and the message of the CanUpdateMachineSet answer
    first = outputs[0].read_text(encoding="utf-8")
    assert "can-update-machineset" in first, first
    assert "in place: kubeadm_files, kubernetes_version" in first, first
