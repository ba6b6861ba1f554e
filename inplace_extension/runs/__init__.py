"""Runs: the decisions of an update, whichever executor plays it.

The run service (service.py: what a poll answers, what starts next), the state machine over the attempts
(policy.py), when a play is expected to end (play_time.py), maintenance windows and holds (windows.py,
holds.py), the answers' words (progress.py), host resolution (resolve.py, inventory.py), the values
exchanged with callers (model.py) and what an attempt is and ended as (attempts.py), and the port the two
executors implement (backend.py): the ``local`` one (inplace_extension.local) and the ``kubernetes`` one
(inplace_extension.kubejobs). It knows nothing of CAPI wire models, nor of Ansible: the hooks layer
hands it a :class:`inplace_extension.runs.model.RunRequest` and gets a
:class:`inplace_extension.runs.model.Progress` back.
"""
