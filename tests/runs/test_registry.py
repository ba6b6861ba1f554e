"""The in-memory registry: bounded parallelism, FIFO positions, one run per Machine at a time."""

from __future__ import annotations

import threading

from hostlab.proc import wait_until

from inplace_extension.runs.registry import Job, JobState, RunRegistry


class Gates:
    def __init__(self) -> None:
        self.release: dict[str, threading.Event] = {}
        self.ran: list[str] = []
        self.lock = threading.Lock()
        self.active: set[str] = set()
        self.max_active = 0

        self.batches: list[list[str]] = []

    def job(self, ident: str, machine: str) -> Job[None]:
        self.release[ident] = threading.Event()
        return Job(ident, machine, None)

    def work(self, batch: list[Job[None]]) -> None:
        with self.lock:
            self.batches.append([j.ident for j in batch])
            for job in batch:
                self.ran.append(job.ident)
                self.active.add(job.ident)
            self.max_active = max(self.max_active, len(self.active))
        for job in batch:
            self.release[job.ident].wait(10)
        with self.lock:
            for job in batch:
                self.active.discard(job.ident)


def test_fifo_queue_with_positions_and_bounded_slots() -> None:
    gates = Gates()
    reg = RunRegistry(2, gates.work)
    for i in range(5):
        assert reg.submit(gates.job(f"r{i}", f"ns/m{i}"))
    assert not reg.submit(Job("r0", "ns/m0", None))  # same ident: already known
    assert wait_until(lambda: len(gates.ran) == 2, 5, 0.01)
    assert [reg.view(f"r{i}").message() for i in range(5)] == [  # type: ignore[union-attr]
        "running: starting",
        "running: starting",
        "queued: position 1 of 3",
        "queued: position 2 of 3",
        "queued: position 3 of 3",
    ]
    reg.set_phase("r0", "ntp")
    assert reg.view("r0").message() == "running: ntp"  # type: ignore[union-attr]
    gates.release["r1"].set()
    assert wait_until(lambda: gates.ran == ["r0", "r1", "r2"], 5, 0.01)
    assert reg.view("r1") is None
    assert reg.view("r3").message() == "queued: position 1 of 2"  # type: ignore[union-attr]
    gates.release["r0"].set()
    assert wait_until(lambda: "r3" in gates.ran, 5, 0.01)
    assert "r4" not in gates.ran  # r2 and r3 hold both slots
    for ev in gates.release.values():
        ev.set()
    assert wait_until(lambda: reg.in_flight() == 0, 5, 0.01)
    assert gates.ran == ["r0", "r1", "r2", "r3", "r4"]
    assert gates.max_active == 2


def test_one_machine_never_runs_twice_at_once() -> None:
    gates = Gates()
    reg = RunRegistry(4, gates.work)
    reg.submit(gates.job("a1", "ns/a"))
    reg.submit(gates.job("a2", "ns/a"))  # new fingerprint for the same Machine
    reg.submit(gates.job("b1", "ns/b"))
    assert wait_until(lambda: sorted(gates.ran) == ["a1", "b1"], 5, 0.01)
    view = reg.view("a2")
    assert view is not None and view.state is JobState.QUEUED
    gates.release["a1"].set()
    assert wait_until(lambda: "a2" in gates.ran, 5, 0.01)
    for ev in gates.release.values():
        ev.set()
    assert wait_until(lambda: reg.in_flight() == 0, 5, 0.01)


def test_a_crashing_batch_gives_its_slots_back() -> None:
    done = threading.Event()

    def run(batch: list[Job[str]]) -> None:
        if batch[0].payload == "boom":
            raise RuntimeError("bug")
        done.set()

    reg = RunRegistry(1, run)
    reg.submit(Job("x", "ns/x", "boom"))
    reg.submit(Job("y", "ns/y", "fine"))
    assert done.wait(5)


def test_jobs_submitted_within_the_window_share_a_batch() -> None:
    gates = Gates()
    reg = RunRegistry(3, gates.work, window=0.2)
    for i in range(4):
        reg.submit(gates.job(f"w{i}", f"ns/w{i}"))
    assert wait_until(lambda: len(gates.batches) == 1, 5, 0.01)
    assert gates.batches == [["w0", "w1", "w2"]]  # bounded by the slots; w3 waits its turn
    assert reg.view("w3").message() == "queued: position 1 of 1"  # type: ignore[union-attr]
    for ev in gates.release.values():
        ev.set()
    assert wait_until(lambda: reg.in_flight() == 0, 5, 0.01)
    assert gates.batches == [["w0", "w1", "w2"], ["w3"]]


def test_close_drops_the_queue() -> None:
    gates = Gates()
    reg = RunRegistry(1, gates.work)
    reg.submit(gates.job("a", "ns/a"))
    reg.submit(gates.job("b", "ns/b"))
    assert wait_until(lambda: gates.ran == ["a"], 5, 0.01)
    threads = reg.close()
    assert len(threads) == 1
    assert reg.view("b") is None
    assert not reg.submit(gates.job("c", "ns/c"))
    gates.release["a"].set()
    threads[0].join(5)
    assert gates.ran == ["a"]


def test_a_queued_job_withdrawn_leaves_and_a_released_one_frees_its_slot_at_once() -> None:
    """withdraw: out of the queue before a slot admits it (its on_done called once); release: admitted
    to a batch but not playing, it leaves its slot at once, not when the batch's play ends, and the
    ident may be queued again meanwhile without the batch's end taking the new job out."""
    done: list[str] = []
    gates = Gates()
    released = threading.Event()
    reg: RunRegistry[None] = RunRegistry(1, lambda batch: None)

    def work(batch: list[Job[None]]) -> None:
        for job in batch:
            if job.ident == "r1" and not released.is_set():
                reg.release(job)  # refused at its start: it does not play
                released.set()
                gates.release["hold"].wait(10)  # the batch's thread goes on a while
            else:
                gates.work([job])

    reg = RunRegistry(1, work)
    gates.release["hold"] = threading.Event()
    first = gates.job("r0", "ns/m0")
    assert reg.submit(first)
    assert wait_until(lambda: gates.ran == ["r0"], 5, 0.01)
    queued = Job("r9", "ns/m9", None, on_done=lambda: done.append("r9"))
    assert reg.submit(queued)
    assert reg.view("r9").state is JobState.QUEUED  # type: ignore[union-attr]
    assert reg.withdraw("r9") and reg.view("r9") is None and done == ["r9"]
    assert not reg.withdraw("r0"), "a running job is not withdrawn"
    assert reg.submit(Job("r1", "ns/m1", None, on_done=lambda: done.append("r1")))
    assert reg.submit(gates.job("r2", "ns/m2"))
    gates.release["r0"].set()
    assert wait_until(released.is_set, 5, 0.01)
    # r1's slot is free while its batch's thread still runs: r2 is admitted and plays
    assert wait_until(lambda: gates.ran == ["r0", "r2"], 5, 0.01)
    assert reg.view("r1") is None and done == ["r9", "r1"]
    again = Job("r1", "ns/m1", None)
    gates.release["r1"] = threading.Event()
    assert reg.submit(again)  # the same ident queued again
    gates.release["hold"].set()  # the old batch ends: it must not take the new r1 out
    gates.release["r2"].set()
    assert wait_until(lambda: gates.ran == ["r0", "r2", "r1"], 5, 0.01)
    assert done == ["r9", "r1"], "on_done once per job"
    gates.release["r1"].set()
    assert wait_until(lambda: reg.in_flight() == 0, 5, 0.01)
