"""When MCM evicted each workload Pod, as the API server recorded it: a watch on the Pods' namespace in
a thread, kept for the test's end.

A deleted Pod carries ``deletionTimestamp`` (the delete time plus its grace period, in whole seconds) and
``deletionGracePeriodSeconds``; their difference is when the eviction was asked for, by the API server's
clock (this machine's, as the run artifacts'). kwok finishes the deletion at once, so the watch, not a
poll, is what sees every Pod between its eviction and its removal.
"""

from __future__ import annotations

import json
import threading
from datetime import datetime
from typing import Any

import httpx
from kubelab.lab import Lab

WINDOW_SECONDS = 5  # each watch request ends after this long (stop() waits at most that), then resumes


class Evictions:
    """Watches the Pods of ``namespace`` from construction until :meth:`stop`."""

    def __init__(self, lab: Lab, namespace: str) -> None:
        self._lab, self._namespace = lab, namespace
        self._asked: dict[str, float] = {}  # Pod -> when its deletion was asked for (epoch seconds)
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self._watching = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="pod evictions", daemon=True)
        self._thread.start()
        if not self._watching.wait(30):
            raise AssertionError("the Pod watch did not start")

    def asked(self) -> dict[str, float]:
        with self._lock:
            return dict(self._asked)

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(WINDOW_SECONDS + 30)

    def _watch(self) -> None:
        """Watch requests of WINDOW_SECONDS each, every one resuming at the last resourceVersion seen (so
        no event falls between two); the first lists what exists."""
        path = f"/api/v1/namespaces/{self._namespace}/pods"
        version: str | None = None
        with self._lab.http() as client:
            while not self._stopped.is_set():
                params = {"watch": "true", "timeoutSeconds": str(WINDOW_SECONDS)}
                if version is not None:
                    params["resourceVersion"] = version
                try:
                    with client.stream("GET", path, params=params, timeout=WINDOW_SECONDS + 30) as response:
                        self._watching.set()
                        for line in response.iter_lines():
                            if not line:
                                continue
                            event = json.loads(line)
                            if event.get("type") == "ERROR":  # e.g. 410 Gone: start again from a list
                                version = None
                                break
                            pod = event.get("object") or {}
                            version = pod.get("metadata", {}).get("resourceVersion", version)
                            self._seen(pod)
                except httpx.HTTPError:
                    self._stopped.wait(0.2)  # the API server went away for a moment: watch again

    def _seen(self, pod: dict[str, Any]) -> None:
        metadata = pod.get("metadata") or {}
        deletion = metadata.get("deletionTimestamp")
        if deletion is None:
            return
        grace = float(metadata.get("deletionGracePeriodSeconds") or 0)
        asked = datetime.fromisoformat(deletion.replace("Z", "+00:00")).timestamp() - grace
        with self._lock:
            self._asked.setdefault(str(metadata.get("name", "")), asked)
