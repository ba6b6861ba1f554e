"""hostlab: isolated Debian test hosts reachable over SSH, for tests, benchmarks and the demo.

Each host runs in its own network, PID, mount, UTS and IPC namespaces on a per-lab bridge, with its
own overlay root filesystem (a cached Debian base + a size-limited tmpfs upper layer), sshd with key
auth, python3, sudo and a key-only ``ansible`` user. See README.md, section "Test host lab".

Modules: :mod:`hostlab.lab` (``Lab``: up/down/reset/status, SSH and nsenter into hosts; with
:mod:`hostlab.state`, :mod:`hostlab.network`, :mod:`hostlab.hosts`), :mod:`hostlab.faults`,
:mod:`hostlab.inventory`, :mod:`hostlab.base` (the cached Debian base), the pytest plugin
:mod:`hostlab.pytest_plugin`, the ``hostlab`` CLI (:mod:`hostlab.cli`) and :mod:`hostlab.demo`
(with ``demo_requests``, ``demo_capi``, ``demo_service``).
"""
