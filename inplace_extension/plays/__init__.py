"""Plays: an attempt on its host, through ansible-runner and ansible-core, shared by both executors.

A batch of attempts played by one ``ansible-playbook`` (batch.py), ansible-runner's adapter (runner.py),
the detached play and the fork server it starts from (detach.py, forkserver.py, forkserver_process.py),
the SSH settings of a host (ssh.py), the steps a play reports (steps.py), the attempt and batch
directories on disk (artifacts.py), what an attempt ended as, read from them (outcomes.py), and the host
dry run (dry_run.py). Used by the ``local`` backend's worker threads (inplace_extension.local), the
``kubernetes`` executor's attempt Job and its dry-run Job (inplace_extension.kubejobs). The only package
that imports ``ansible_runner`` and ``ansible``.
"""
