"""What one process remembers, bounded: a set (:class:`Memo`) and a map (:class:`Recent`) that forget
their oldest entries.

The run service remembers which updates passed their health gate, which failures it handed to the
cluster side and which wait it last posted as an Event, and the backends keep the attempts they last
read per update (for the status board, and the ``local`` one to answer without reading its disk again),
only so that they do not do the same work again on the next poll. All are optimisations, never the
record (another replica, or this one after a restart, does the work once more and gets the same
answer), so they may forget: without a bound they grew for the life of the process, one entry per
update it ever saw.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Final, Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

# far more than the updates of one rollout that a replica polls at once; each entry is a short tuple
DEFAULT_BOUND: Final = 4096


class Memo(Generic[K]):
    """A thread-safe set of at most ``bound`` keys; adding one past the bound forgets the oldest."""

    def __init__(self, bound: int = DEFAULT_BOUND) -> None:
        if bound < 1:
            raise ValueError("bound must be >= 1")
        self._bound = bound
        self._keys: OrderedDict[K, None] = OrderedDict()
        self._lock = threading.Lock()

    def __contains__(self, key: K) -> bool:
        with self._lock:
            return key in self._keys

    def add(self, key: K) -> None:
        with self._lock:
            self._keys[key] = None
            self._keys.move_to_end(key)
            while len(self._keys) > self._bound:
                self._keys.popitem(last=False)

    def __len__(self) -> int:
        with self._lock:
            return len(self._keys)


class Recent(Generic[K, V]):
    """A thread-safe map of at most ``bound`` keys; setting one past the bound forgets the least recently
    set (a key set again counts as new)."""

    def __init__(self, bound: int | None = None) -> None:
        """``bound``: None is :data:`DEFAULT_BOUND` as it is when the map is made."""
        bound = DEFAULT_BOUND if bound is None else bound
        if bound < 1:
            raise ValueError("bound must be >= 1")
        self._bound = bound
        self._entries: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        with self._lock:
            return self._entries.get(key)

    def set(self, key: K, value: V) -> None:
        with self._lock:
            self._entries[key] = value
            self._entries.move_to_end(key)
            while len(self._entries) > self._bound:
                self._entries.popitem(last=False)

    def pop(self, key: K) -> V | None:
        with self._lock:
            return self._entries.pop(key, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)
