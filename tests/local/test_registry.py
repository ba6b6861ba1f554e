"""The in-memory registry: bounded parallelism, FIFO positions, one run per Machine at a time."""

from __future__ import annotations

import threading

from hostlab.proc import wait_until

from inplace_extension.local.registry import Entry, EntryState, RunRegistry


class Gates:
    def __init__(self) -> None:
        self.release: dict[str, threading.Event] = {}
        self.ran: list[str] = []
        self.lock = threading.Lock()
        self.active: set[str] = set()
        self.max_active = 0

        self.batches: list[list[str]] = []

    def entry(self, ident: str, machine: str) -> Entry[None]:
        self.release[ident] = threading.Event()
        return Entry(ident, machine, None)

    def work(self, batch: list[Entry[None]]) -> None:
        with self.lock:
            self.batches.append([j.ident for j in batch])
            for entry in batch:
                self.ran.append(entry.ident)
                self.active.add(entry.ident)
            self.max_active = max(self.max_active, len(self.active))
        for entry in batch:
            self.release[entry.ident].wait(10)
        with self.lock:
            for entry in batch:
                self.active.discard(entry.ident)


def test_fifo_queue_with_positions_and_bounded_slots() -> None:
    gates = Gates()
    reg = RunRegistry(2, gates.work)
    for i in range(5):
        assert reg.submit(gates.entry(f"r{i}", f"ns/m{i}"))
    assert not reg.submit(Entry("r0", "ns/m0", None))  # same ident: already known
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
    reg.submit(gates.entry("a1", "ns/a"))
    reg.submit(gates.entry("a2", "ns/a"))  # new fingerprint for the same Machine
    reg.submit(gates.entry("b1", "ns/b"))
    assert wait_until(lambda: sorted(gates.ran) == ["a1", "b1"], 5, 0.01)
    view = reg.view("a2")
    assert view is not None and view.state is EntryState.QUEUED
    gates.release["a1"].set()
    assert wait_until(lambda: "a2" in gates.ran, 5, 0.01)
    for ev in gates.release.values():
        ev.set()
    assert wait_until(lambda: reg.in_flight() == 0, 5, 0.01)


def test_a_crashing_batch_gives_its_slots_back() -> None:
    done = threading.Event()

    def run(batch: list[Entry[str]]) -> None:
        if batch[0].payload == "boom":
            raise RuntimeError("bug")
        done.set()

    reg = RunRegistry(1, run)
    reg.submit(Entry("x", "ns/x", "boom"))
    reg.submit(Entry("y", "ns/y", "fine"))
    assert done.wait(5)


def test_jobs_submitted_within_the_window_share_a_batch() -> None:
    gates = Gates()
    reg = RunRegistry(3, gates.work, window=0.2)
    for i in range(4):
        reg.submit(gates.entry(f"w{i}", f"ns/w{i}"))
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
    reg.submit(gates.entry("a", "ns/a"))
    reg.submit(gates.entry("b", "ns/b"))
    assert wait_until(lambda: gates.ran == ["a"], 5, 0.01)
    threads = reg.close()
    assert len(threads) == 1
    assert reg.view("b") is None
    assert not reg.submit(gates.entry("c", "ns/c"))
    gates.release["a"].set()
    threads[0].join(5)
    assert gates.ran == ["a"]


def test_a_queued_job_withdrawn_leaves_and_a_released_one_frees_its_slot_at_once() -> None:
    """withdraw: out of the queue before a slot admits it (its on_done called once); release: admitted
    to a batch but not playing, it leaves its slot at once, not when the batch's play ends, and the
    ident may be queued again meanwhile without the batch's end taking the new entry out."""
    done: list[str] = []
    gates = Gates()
    released = threading.Event()
    reg: RunRegistry[None] = RunRegistry(1, lambda batch: None)

    def work(batch: list[Entry[None]]) -> None:
        for entry in batch:
            if entry.ident == "r1" and not released.is_set():
                reg.release(entry)  # refused at its start: it does not play
                released.set()
                gates.release["hold"].wait(10)  # the batch's thread goes on a while
            else:
                gates.work([entry])

    reg = RunRegistry(1, work)
    gates.release["hold"] = threading.Event()
    first = gates.entry("r0", "ns/m0")
    assert reg.submit(first)
    assert wait_until(lambda: gates.ran == ["r0"], 5, 0.01)
    queued = Entry("r9", "ns/m9", None, on_done=lambda: done.append("r9"))
    assert reg.submit(queued)
    assert reg.view("r9").state is EntryState.QUEUED  # type: ignore[union-attr]
    assert reg.withdraw("r9") and reg.view("r9") is None and done == ["r9"]
    assert not reg.withdraw("r0"), "a running entry is not withdrawn"
    assert reg.submit(Entry("r1", "ns/m1", None, on_done=lambda: done.append("r1")))
    assert reg.submit(gates.entry("r2", "ns/m2"))
    gates.release["r0"].set()
    assert wait_until(released.is_set, 5, 0.01)
    # r1's slot is free while its batch's thread still runs: r2 is admitted and plays
    assert wait_until(lambda: gates.ran == ["r0", "r2"], 5, 0.01)
    assert reg.view("r1") is None and done == ["r9", "r1"]
    again = Entry("r1", "ns/m1", None)
    gates.release["r1"] = threading.Event()
    assert reg.submit(again)  # the same ident queued again
    gates.release["hold"].set()  # the old batch ends: it must not take the new r1 out
    gates.release["r2"].set()
    assert wait_until(lambda: gates.ran == ["r0", "r2", "r1"], 5, 0.01)
    assert done == ["r9", "r1"], "on_done once per entry"
    gates.release["r1"].set()
    assert wait_until(lambda: reg.in_flight() == 0, 5, 0.01)
