"""The work units of parallel runs (tests/conftest.py): a small suite run in two xdist workers as
``scripts/test`` runs the real one, each test recording the worker it ran on."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from hostlab.proc import wait_until

SUITE_CONFTEST = Path(__file__).resolve().parent / "conftest.py"


def suite_conftest(*hooks: str) -> str:
    """The conftest of an inner suite: it loads the real suite's conftest and takes ``hooks`` from it."""
    loads = f"""
import importlib.util
spec = importlib.util.spec_from_file_location("suite_conftest", {str(SUITE_CONFTEST)!r})
suite = importlib.util.module_from_spec(spec)
spec.loader.exec_module(suite)
"""
    return loads + "".join(f"{hook} = suite.{hook}\n" for hook in hooks)


def inner_pytest(root: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """Run pytest on the inner suite at ``root`` with only ``env`` (and a PATH)."""
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=root,
        env={"PATH": "/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


RECORDING_TEST = """
import json, os, pytest
from pathlib import Path

{mark}

@pytest.mark.parametrize("n", range({count}))
def test_records_its_worker(n, request):
    out = Path(os.environ["RECORD_DIR"]) / (request.node.nodeid.replace("/", "_").replace(":", "_") + ".json")
    out.write_text(json.dumps({{"worker": os.environ["PYTEST_XDIST_WORKER"], "test": request.node.nodeid}}))
"""


def _write_suite(root: Path) -> None:
    (root / "conftest.py").write_text(suite_conftest("pytest_collection_modifyitems"))
    (root / "pytest.ini").write_text("[pytest]\nmarkers =\n    capi: CAPI lab\n    mcm: MCM lab\n")
    modules = {
        "test_a_unit.py": ("", 6),
        "test_b_capi_one.py": ("pytestmark = pytest.mark.capi", 3),
        "test_c_unit.py": ("", 6),
        "test_d_capi_two.py": ("pytestmark = pytest.mark.capi", 3),
        "test_e_mcm.py": ("pytestmark = pytest.mark.mcm", 3),
    }
    for name, (mark, count) in modules.items():
        (root / name).write_text(RECORDING_TEST.format(mark=mark, count=count))


def _run(root: Path, records: Path, *args: str) -> list[dict[str, str]]:
    result = inner_pytest(root, {"RECORD_DIR": str(records)}, "-p", "xdist", *args)
    assert result.returncode == 0, result.stdout + result.stderr
    return [json.loads(p.read_text()) for p in sorted(records.glob("*.json"))]


def test_each_lab_and_each_module_runs_on_one_worker(tmp_path: Path) -> None:
    root, records = tmp_path / "suite", tmp_path / "records"
    root.mkdir()
    records.mkdir()
    _write_suite(root)
    ran = _run(root, records, "-n", "2", "--dist", "loadgroup", "--no-loadscope-reorder")
    assert len(ran) == 21
    workers: dict[str, set[str]] = {}
    groups: dict[str, set[str]] = {}
    for record in ran:
        module = record["test"].split("::")[0]
        unit = "mcm" if "mcm" in module else module  # each CAPI module is a unit of its own
        workers.setdefault(unit, set()).add(record["worker"])
        groups.setdefault(module, set()).add(record["test"].rsplit("@", 1)[-1])
    assert all(len(used) == 1 for used in workers.values()), workers
    # the CAPI tests are grouped by module (the workers share the CAPI lab), the MCM tests all together
    assert groups["test_b_capi_one.py"] == {"capi-lab:test_b_capi_one.py"}
    assert groups["test_d_capi_two.py"] == {"capi-lab:test_d_capi_two.py"}
    assert groups["test_e_mcm.py"] == {"mcm-lab"}
    # the MCM unit and the first CAPI module start first, on the two workers
    assert workers["mcm"] != workers["test_b_capi_one.py"]
    assert {r["worker"] for r in ran} == {"gw0", "gw1"}


def test_a_serial_run_keeps_the_collection_order(tmp_path: Path) -> None:
    # no xdist worker (a developer's plain run): the lab units are not moved to the front
    root = tmp_path / "suite"
    root.mkdir()
    _write_suite(root)
    result = inner_pytest(root, {}, "--collect-only")
    assert result.returncode == 0, result.stdout + result.stderr
    files = [line.split("::")[0] for line in result.stdout.splitlines() if "::" in line]
    assert len(files) == 21 and files == sorted(files)


LOCK_TEST = """
import fcntl, os, pytest
from pathlib import Path

def takes(mode):
    path = Path(os.environ["KUBELAB_RUN_DIR"]) / "capi-tests.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)

@pytest.mark.capi
def test_shared():
    assert takes(fcntl.LOCK_SH) and not takes(fcntl.LOCK_EX)

@pytest.mark.capi
@pytest.mark.capi_alone
def test_alone():
    assert not takes(fcntl.LOCK_SH)

def test_not_capi():
    assert takes(fcntl.LOCK_EX)
"""


def test_capi_tests_hold_the_lab_lock_shared_and_capi_alone_tests_exclusively(tmp_path: Path) -> None:
    root, run_dir = tmp_path / "suite", tmp_path / "run"
    root.mkdir()
    (root / "conftest.py").write_text(suite_conftest("pytest_runtest_protocol"))
    (root / "pytest.ini").write_text("[pytest]\nmarkers =\n    capi: CAPI lab\n    capi_alone: alone\n")
    (root / "test_lock.py").write_text(LOCK_TEST)
    result = inner_pytest(root, {"KUBELAB_RUN_DIR": str(run_dir)})
    assert result.returncode == 0 and "3 passed" in result.stdout, result.stdout + result.stderr


def _blocked_waiters(*paths: Path) -> int:
    """Lock requests queued in the kernel (``->`` lines of /proc/locks) on the inodes of ``paths``."""
    inodes = {str(p.stat().st_ino) for p in paths if p.exists()}
    lines = Path("/proc/locks").read_text().splitlines()
    return sum(1 for line in lines if "->" in line and line.split()[-3].rsplit(":", 1)[-1] in inodes)


def test_a_capi_alone_waiter_is_not_overtaken_by_tests_starting_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """flock(2) grants a shared lock while an exclusive request waits: without the turnstile the test
    that starts after the capi_alone one gets the lab first."""
    spec = importlib.util.spec_from_file_location("suite_conftest", SUITE_CONFTEST)
    assert spec is not None and spec.loader is not None
    suite = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(suite)
    monkeypatch.setenv("KUBELAB_RUN_DIR", str(tmp_path))
    order: list[str] = []
    release = threading.Event()

    def running(name: str, alone: bool, until: threading.Event | None = None) -> threading.Thread:
        def body() -> None:
            with suite.capi_lab_share(alone=alone):
                order.append(name)
                if until is not None:
                    until.wait(30)

        thread = threading.Thread(target=body, daemon=True)
        thread.start()
        return thread

    first = running("first", alone=False, until=release)
    assert wait_until(lambda: order == ["first"], 10, 0.01)
    alone = running("alone", alone=True)
    lock, turnstile = tmp_path / "capi-tests.lock", tmp_path / "capi-tests.turnstile"
    assert wait_until(lambda: _blocked_waiters(lock, turnstile) == 1, 10, 0.01), "the alone test waits"
    later = running("later", alone=False)
    # the later test either waits too (queued behind the alone one) or, without the turnstile, got in
    assert wait_until(lambda: _blocked_waiters(lock, turnstile) == 2 or "later" in order, 10, 0.01)
    release.set()
    for thread in (first, alone, later):
        thread.join(30)
    assert order == ["first", "alone", "later"]


class _Item:
    """What work_unit reads of a collected test: its node id, fixtures and markers (none here)."""

    def __init__(self, nodeid: str, fixturenames: list[str]) -> None:
        self.nodeid = nodeid
        self.fixturenames = fixturenames

    def get_closest_marker(self, name: str) -> None:
        return None


def test_the_real_nodes_tests_are_one_unit() -> None:
    spec = importlib.util.spec_from_file_location("suite_conftest", SUITE_CONFTEST)
    assert spec is not None and spec.loader is not None
    suite = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(suite)
    shared = _Item("tests/nodes/test_node_pods.py::test_job", ["node_cluster"])
    own = _Item("tests/nodes/test_node_control_plane.py::test_upgrade", ["kubeadm_cluster"])
    plain = _Item("tests/nodes/test_other.py::test_it", ["tmp_path"])
    assert suite.work_unit(shared) == suite.work_unit(own) == "node-lab"
    assert suite.work_unit(plain) == "tests/nodes/test_other.py"


KUBE_SPLIT_TEST = """
import pytest

@pytest.mark.kube
def test_needs_the_lab():
    pass

def test_needs_no_lab():
    pass
"""


@pytest.mark.parametrize(
    ("choice", "kept"),
    [
        ("run", {"test_needs_the_lab", "test_needs_no_lab"}),
        ("deselect", {"test_needs_no_lab"}),
        ("only", {"test_needs_the_lab"}),
    ],
)
def test_the_two_parts_split_the_suite_by_the_kube_marker(
    tmp_path: Path, choice: str, kept: set[str]
) -> None:
    (tmp_path / "conftest.py").write_text(suite_conftest("pytest_addoption", "pytest_collection_modifyitems"))
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    kube: the Kubernetes lab\n")
    (tmp_path / "test_split.py").write_text(KUBE_SPLIT_TEST)
    result = inner_pytest(tmp_path, {}, "-rA", f"--kube-tests={choice}")
    assert result.returncode == 0, result.stdout + result.stderr
    passed = set(re.findall(r"^PASSED test_split.py::(\w+)", result.stdout, re.M))
    assert passed == kept
    # a part that keeps no test is pytest's "no tests collected" (5), which whole_rc weighs with the other
    result = inner_pytest(tmp_path, {}, f"--kube-tests={choice}", "-k", "no_lab and not no_lab")
    assert result.returncode == 5, result.stdout + result.stderr
