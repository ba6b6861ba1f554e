"""``Lab``: one named control plane (etcd, kube-apiserver, kube-controller-manager, kwok) and the
flavours started on it; up, down, status, the admin kubeconfig, and the API-outage fault.

Processes are started detached (their own session, log file in the lab directory) and recorded in
the state file; ``down`` stops them by PID in reverse start order (so flavour controllers and
clients go before the apiserver, and the apiserver before etcd: an apiserver whose etcd is gone may
ignore SIGTERM), SIGTERM first, SIGKILL after a timeout. ``down`` removes the lab directory and keeps
the logs under ``<cache>/lab-logs/<name>/`` for post-mortems.
"""

from __future__ import annotations

import os
import shutil
import signal
import ssl
import subprocess
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any

import httpx
from hostlab.errors import LabError
from hostlab.proc import file_lock, kill_and_wait, not_ours_because, spawn, wait_until

from kubelab import build, core, flavours, ports, reads, state
from kubelab.config import APISERVER_NAME, NAME_RE, Config
from kubelab.pki import CertificateAuthority
from kubelab.state import Component, LabState

READY_TIMEOUT = 180.0  # a cold apiserver on 2 busy cores needs ~6-30 s; CAPI controllers more
STOP_TIMEOUT = 15.0
LOCAL_NAMES = ("127.0.0.1", "localhost")
Ready = Callable[[], bool]


class Lab:
    def __init__(self, name: str, cfg: Config | None = None) -> None:
        if not NAME_RE.match(name):
            raise LabError(f"kubelab: invalid lab name {name!r} (lowercase letters, digits, '-')")
        self.name = name
        self.cfg = cfg or Config.from_env()
        self.dir = self.cfg.lab_dir(name)
        self.pki_dir = self.dir / "pki"
        self.kubeconfig = self.dir / "kubeconfig"
        self.bin: dict[str, Path] = {}

    # -- state -------------------------------------------------------------------------------------
    def state(self) -> LabState:
        current = state.load(self.dir)
        if current is None:
            raise LabError(f"kubelab: lab {self.name!r} is not up (no {state.state_path(self.dir)})")
        return current

    def is_up(self) -> bool:
        return state.load(self.dir) is not None

    @property
    def server(self) -> str:
        return self.state().server

    @property
    def ca(self) -> Path:
        """The lab CA's certificate (the ``caBundle`` for webhooks and extensions)."""
        return self.pki_dir / "ca.crt"

    @property
    def pki(self) -> CertificateAuthority:
        return CertificateAuthority(self.pki_dir)

    def binary(self, name: str) -> Path:
        if name not in self.bin:
            self.bin.update(build.ensure_built([name], self.cfg))
        return self.bin[name]

    # -- lifecycle ---------------------------------------------------------------------------------
    def up(
        self,
        flavour_names: Sequence[str] = (),
        owner_pid: int | None = None,
        progress: Callable[[str], None] = print,
    ) -> None:
        """Build what is missing, start the core, wait until every part is ready, then the flavours."""
        existing = state.load(self.dir)
        if existing is not None:
            if existing.owner_alive() and all(c.running() for c in existing.components):
                raise LabError(f"kubelab: lab {self.name!r} is already up ({existing.server})")
            self.down()
        needed = [*build.CORE_BINARIES, *(b for f in flavour_names for b in flavours.load(f).binaries)]
        self.bin = build.ensure_built(needed, self.cfg, progress)
        kwok_stages = build.module_source(self.cfg, "kwok", "sigs.k8s.io/kwok") / "kustomize" / "stage"
        self.dir.mkdir(parents=True, exist_ok=True)
        ca = CertificateAuthority(self.pki_dir)
        ports = {k: self.free_port() for k in ("etcd", "etcd-peer", "apiserver", "kwok")}
        server = f"https://127.0.0.1:{ports['apiserver']}"
        admin = ca.issue_client("admin", "kubelab-admin", ("system:masters",))
        paths = core.CorePaths(
            self.dir,
            ca.cert_path,
            # and the `kubernetes` Service's ClusterIP: Pods on real nodes reach the apiserver there
            ca.issue_server("apiserver", (*LOCAL_NAMES, APISERVER_NAME, core.KUBERNETES_SERVICE_IP)),
            ca.service_account_keys(),
            self.kubeconfig,
        )
        self.kubeconfig.write_text(core.kubeconfig_text(server, ca.cert_path, admin))
        state.save(self.dir, LabState(self.name, owner_pid or os.getpid(), server, ports))
        try:
            etcd = core.etcd_argv(self.bin["etcd"], paths, ports["etcd"], ports["etcd-peer"])
            self.start_component("etcd", etcd, ready=f"http://127.0.0.1:{ports['etcd']}/health")
            apiserver = core.apiserver_argv(
                self.bin["kube-apiserver"], paths, ports["etcd"], ports["apiserver"]
            )
            self.start_component("kube-apiserver", apiserver, ready=self._api_ready)
            kcm = core.controller_manager_argv(self.bin["kube-controller-manager"], paths)
            self.start_component("kube-controller-manager", kcm, ready=self._default_service_account)
            kwok = core.kwok_argv(self.bin["kwok"], paths, kwok_stages, ports["kwok"])
            # HOME: kwok also reads ~/.kwok/kwok.yaml; a user's file there must not change the lab
            self.start_component(
                "kwok", kwok, env={"HOME": str(self.dir)}, ready=f"http://127.0.0.1:{ports['kwok']}/healthz"
            )
            for name in flavour_names:
                self.ensure_flavour(name)
        except BaseException:
            self.down()
            raise
        progress(f"kubelab {self.name}: up, API server {server}, kubeconfig {self.kubeconfig}")

    def ensure_flavour(self, name: str) -> None:
        """Start flavour ``name`` on this running lab unless it already runs (idempotent)."""
        flavour = flavours.load(name)
        with file_lock(self.dir / "flavour.lock", what="kubelab flavour lock", timeout=1800):
            if name in self.state().flavours:
                return
            self.bin.update(build.ensure_built(flavour.binaries, self.cfg))
            flavour.start(self)
            current = self.state()
            current.flavours.append(name)
            state.save(self.dir, current)

    def stop_flavour(self, name: str) -> None:
        """Stop flavour ``name``'s controllers on this lab unless it is not running (idempotent); what it
        applied (CRDs, objects) stays, and a later :meth:`ensure_flavour` starts it again. For a test that
        runs a flavour's controllers for a while on a lab others share (e.g. ``mcm`` on the node lab)."""
        flavour = flavours.load(name)
        stop = getattr(flavour, "stop", None)
        if stop is None:
            raise LabError(f"kubelab: flavour {name!r} cannot be stopped on its own")
        with file_lock(self.dir / "flavour.lock", what="kubelab flavour lock", timeout=1800):
            if name not in self.state().flavours:
                return
            stop(self)
            current = self.state()
            current.flavours.remove(name)
            state.save(self.dir, current)

    def down(self) -> None:
        """Stop every process (reverse start order, by PID), keep the logs, remove the lab directory."""
        reads.close(self)
        current = state.load(self.dir)
        if current is not None:
            for component in reversed(current.components):
                self._stop(component)
        if self.dir.exists():
            logs = self.cfg.cache_dir / "lab-logs" / self.name
            shutil.rmtree(logs, ignore_errors=True)
            logs.mkdir(parents=True, exist_ok=True)
            for log in self.dir.glob("*.log"):
                with suppress(OSError):
                    shutil.copy2(log, logs / log.name)
            shutil.rmtree(self.dir, ignore_errors=True)

    def status(self) -> dict[str, Any]:
        current = self.state()
        return {
            "name": self.name,
            "server": current.server,
            "kubeconfig": str(self.kubeconfig),
            "flavours": current.flavours,
            "components": [
                {"name": c.name, "pid": c.pid, "running": c.running(), "log": c.log}
                for c in current.components
            ],
        }

    # -- processes ---------------------------------------------------------------------------------
    def start_component(
        self,
        name: str,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        ready: str | Ready | None = None,
        timeout: float = READY_TIMEOUT,
    ) -> Component:
        """Start ``argv`` detached with its log in the lab directory, record it, wait until ``ready``.

        ``ready`` is a URL answering 200 (https URLs are called with the lab CA and admin cert) or a
        callable; a process that exits while we wait fails with the end of its log.
        """
        log = self.dir / f"{name}.log"
        marker = str(self.dir) if any(str(self.dir) in a for a in argv) else str(argv[0])
        pid = spawn(list(argv), output=log, env={**os.environ, **(env or {})})
        component = Component(name, pid, list(argv), marker, str(log), dict(env or {}))
        current = self.state()
        current.replace(component)
        state.save(self.dir, current)
        check = ready if callable(ready) else (lambda: self._url_ok(ready)) if ready else None
        if check is not None and not wait_until(lambda: check() or not component.running(), timeout, 0.2):
            raise LabError(f"kubelab: {name} not ready within {timeout:g}s, log: {log}\n{_tail(log)}")
        if not component.running():
            how = not_ours_because(pid, marker)
            raise LabError(f"kubelab: {name} ended while starting ({how}), log: {log}\n{_tail(log)}")
        return component

    def stop_component(self, name: str) -> None:
        component = self.state().component(name)
        if component is not None:
            self._stop(component)

    def remove_component(self, name: str) -> None:
        """Stop ``name`` and drop it from the lab's state: a process a test added and ended on purpose is
        no part of the lab any more. A stopped component that stays recorded means the lab is broken, and
        a worker attaching to a shared lab starts such a lab again (kubelab.pytest_plugin._shared),
        under the feet of the other workers' tests."""
        self.stop_component(name)
        current = self.state()
        current.components = [c for c in current.components if c.name != name]
        state.save(self.dir, current)

    def restart_component(self, name: str, ready: str | Ready | None = None) -> Component:
        component = self.state().component(name)
        if component is None:
            raise LabError(f"kubelab: no component {name!r} in lab {self.name!r}")
        self._stop(component)
        return self.start_component(name, component.argv, component.env, ready)

    def _stop(self, component: Component) -> None:
        if not component.running():
            return
        try:
            kill_and_wait(component.pid, signal.SIGTERM, STOP_TIMEOUT)
        except LabError:
            kill_and_wait(component.pid, signal.SIGKILL, STOP_TIMEOUT)

    # -- faults ------------------------------------------------------------------------------------
    def stop_apiserver(self) -> None:
        """An API outage: the apiserver process is stopped (etcd keeps the data)."""
        self.stop_component("kube-apiserver")

    def start_apiserver(self) -> None:
        """End the outage: the apiserver restarts on the same port with the same flags."""
        self.restart_component("kube-apiserver", ready=self._api_ready)

    def apiserver_running(self) -> bool:
        component = self.state().component("kube-apiserver")
        return component is not None and component.running() and self._api_ready()

    # -- clients -----------------------------------------------------------------------------------
    def kubectl(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        """Run the lab's kubectl as admin; with ``check``, a failure raises LabError with its stderr."""
        argv = [str(self.binary("kubectl")), f"--kubeconfig={self.kubeconfig}", *args]
        try:
            proc = subprocess.run(
                argv, input=input, capture_output=True, text=True, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise LabError(f"kubectl {' '.join(args)} timed out after {timeout:g}s") from exc
        if check and proc.returncode != 0:
            raise LabError(f"kubectl {' '.join(args)} failed (exit {proc.returncode}): {proc.stderr.strip()}")
        return proc

    def http(self) -> httpx.Client:
        """An httpx client on the API server, authenticated as admin."""
        context = ssl.create_default_context(cafile=str(self.ca))
        context.load_cert_chain(str(self.pki_dir / "admin.crt"), str(self.pki_dir / "admin.key"))
        return httpx.Client(base_url=self.server, verify=context, timeout=30)

    free_port = staticmethod(ports.free_port)

    def _url_ok(self, url: str) -> bool:
        try:
            if url.startswith("https://"):
                with self.http() as client:
                    return client.get(url).status_code == 200
            return httpx.get(url, timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    def _api_ready(self) -> bool:
        return self._url_ok(f"{self.server}/readyz")

    def _default_service_account(self) -> bool:
        # the serviceaccount controller made it: the controller-manager runs and reaches the API
        try:
            return reads.get(self, "serviceaccount", "default", "default") is not None
        except LabError:
            return False


def _tail(log: Path, lines: int = 20) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def all_labs(cfg: Config) -> list[str]:
    return state.lab_names(cfg.run_dir / "labs")


def reap_stale(cfg: Config) -> list[str]:
    """Down every lab whose owner process is gone (a killed test session); return their names."""
    reaped = []
    for name in all_labs(cfg):
        current = state.load(cfg.lab_dir(name))
        if current is not None and not current.owner_alive():
            Lab(name, cfg).down()
            reaped.append(name)
    return reaped
