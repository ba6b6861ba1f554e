"""What one process remembers having done already, bounded: a set that forgets its oldest members.

The run service remembers which updates passed their health gate and which failures it handed to the
cluster side, only so that it does not do the same work again on the next poll. Both are optimisations,
never the record (another replica, or this one after a restart, does the work once more and gets the
same answer), so they may forget: without a bound they grew for the life of the process.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from typing import Final, Generic, TypeVar

K = TypeVar("K", bound=Hashable)

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
