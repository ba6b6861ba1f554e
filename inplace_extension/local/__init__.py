"""The ``local`` executor's backend: the record is the runs directory on this disk, each play runs in a
worker thread of this process (backend.py), queued and batched in process memory (registry.py); a poll
may wait for a play's end (waiters.py); a desired state that comes back begins a new episode
(episode.py); the health check's wait has its clock on disk (health_wait.py). The plays themselves are
inplace_extension.plays'.
"""
