"""The binaries kubelab runs, the one table saying how each is built, and the cached, locked builds.

Each binary is built from a wrapper module of ours under ``labs/kubelab/go/<module>/`` (``go.mod`` +
``go.sum``: every upstream version is pinned by a checksum). Binaries land in
``<cache>/bin/<module>-<hash>/`` where the hash covers the module's files (``go.mod``, ``go.sum`` and
any Go code of ours in it), the build recipe of its binaries and the Go version: a version bump or a
new recipe gets a new directory, an unchanged one is never rebuilt. One file lock serialises the
builds of a machine, taken for one binary at a time: two processes never compile a module at once (Go's
build cache would compile its shared packages twice), and a process waiting for a binary gets it as soon
as whoever holds the lock has built it, not after that one's whole batch. ``kubelab build --all`` builds
in :data:`BUILD_ORDER`. ``GOTOOLCHAIN=local`` so a newer toolchain is never downloaded silently;
``-mod=readonly`` so a build never rewrites the pinned ``go.sum``.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from hostlab.errors import LabError
from hostlab.proc import file_lock

from kubelab.config import GO_MODULES_DIR, Config

KUBERNETES_VERSION = "v1.36.3"
# kubelet + kubeadm of the real lab nodes (nodelab): a node joins at the first, upgrades in place to the last
NODE_VERSIONS = ("v1.36.1", "v1.36.3")
# a node joined one minor version behind, upgraded in place to NODE_VERSIONS[-1] (kubeadm's minor upgrade)
MINOR_UPGRADE_VERSION = "v1.35.4"
ETCD_VERSION = "v3.6.14"
KWOK_VERSION = "v0.8.0"
CAPI_VERSION = "v1.14.2"
MCM_VERSION = "v0.62.1"
PROMETHEUS_VERSION = "v3.16.0"  # its Go module's version is v0.316.0 (labs/kubelab/go/promtool/go.mod)
BUILD_FORMAT = 1  # bump when the way binaries are built changes (flags, env)
BUILD_TIMEOUT = 3600.0  # a cold kube-apiserver build took ~10 min on 2 busy cores


def _version_vars(packages: Iterable[str], version: str) -> tuple[str, ...]:
    """``-X`` flags for Kubernetes-style version packages: without them ``/version`` says v0.0.0-master
    and CAPI core refuses the management cluster, MCM's machine controller dies parsing it."""
    major, minor = version.lstrip("v").split(".")[:2]
    values = {
        "gitVersion": version,
        "gitMajor": major,
        "gitMinor": minor,
        "gitTreeState": "clean",
        "gitCommit": "0" * 40,
        "buildDate": "1970-01-01T00:00:00Z",
    }
    return tuple(f"-X {pkg}.{key}={value}" for pkg in packages for key, value in values.items())


K8S_VERSION_FLAGS = _version_vars(
    ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"), KUBERNETES_VERSION
)
CAPI_VERSION_FLAGS = _version_vars(("sigs.k8s.io/cluster-api/version",), CAPI_VERSION)


MCM_COMMIT = "07f7e729412792a109afcf2f4f914db2a60a36b2"  # tag v0.62.1 (the module's .info Origin)
MCM_VERSION_FLAGS = (
    f"-X github.com/gardener/machine-controller-manager/pkg/version.Version={MCM_VERSION}",
    f"-X github.com/gardener/machine-controller-manager/pkg/version.GitSHA={MCM_COMMIT}",
)


@dataclass(frozen=True)
class Binary:
    """One binary: built from ``package`` inside the wrapper module ``module`` with extra ``ldflags`` and
    Go build ``tags``."""

    name: str
    module: str
    package: str
    ldflags: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()


# The control plane kubeadm runs as static Pods on the lab's nodes (tests/nodes/control_plane.py)
CONTROL_PLANE = ("kube-apiserver", "kube-controller-manager", "kube-scheduler")


def _node_binaries(version: str, names: Iterable[str] = ("kubelet", "kubeadm")) -> tuple[Binary, ...]:
    """``<name>-<version>`` of each of ``names``, from the wrapper module ``node-<version>``."""
    flags = _version_vars(("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"), version)
    return tuple(
        Binary(f"{name}-{version}", f"node-{version}", f"k8s.io/kubernetes/cmd/{name}", flags)
        for name in names
    )


def control_plane_binary(component: str, version: str) -> str:
    """The name in :data:`BINARIES` of a control-plane ``component`` at ``version``: at
    :data:`KUBERNETES_VERSION` kubelab's own (the ``k8s`` module), at the first node version the one
    built in that version's node module beside its kubelet; never one module compiled twice."""
    if component not in CONTROL_PLANE:
        raise LabError(f"kubelab: {component} is not a control-plane component: {CONTROL_PLANE}")
    if version == KUBERNETES_VERSION:
        return component
    if version == NODE_VERSIONS[0]:
        return f"{component}-{version}"
    raise LabError(f"kubelab builds no control plane at {version}: {KUBERNETES_VERSION}, {NODE_VERSIONS[0]}")


# The one table of everything kubelab builds. Flavours list the names they need (``binaries``).
BINARIES: dict[str, Binary] = {
    b.name: b
    for b in (
        Binary(
            "etcd",
            "etcd",
            "go.etcd.io/etcd/server/v3",
            (f"-X go.etcd.io/etcd/api/v3/version.GitSHA={ETCD_VERSION}",),
        ),
        Binary("kube-apiserver", "k8s", "k8s.io/kubernetes/cmd/kube-apiserver", K8S_VERSION_FLAGS),
        Binary(
            "kube-controller-manager",
            "k8s",
            "k8s.io/kubernetes/cmd/kube-controller-manager",
            K8S_VERSION_FLAGS,
        ),
        Binary("kube-scheduler", "k8s", "k8s.io/kubernetes/cmd/kube-scheduler", K8S_VERSION_FLAGS),
        Binary("kubectl", "k8s", "k8s.io/kubernetes/cmd/kubectl", K8S_VERSION_FLAGS),
        Binary("kwok", "kwok", "sigs.k8s.io/kwok/cmd/kwok"),
        Binary("capi-core", "capi", "sigs.k8s.io/cluster-api/core", CAPI_VERSION_FLAGS),
        Binary("capi-kcp", "capi", "sigs.k8s.io/cluster-api/controlplane/kubeadm", CAPI_VERSION_FLAGS),
        Binary("capi-cabpk", "capi", "sigs.k8s.io/cluster-api/bootstrap/kubeadm", CAPI_VERSION_FLAGS),
        Binary("capd", "capi", "sigs.k8s.io/cluster-api/test/infrastructure/docker", CAPI_VERSION_FLAGS),
        # clusterctl, at the same CAPI release from a wrapper module of its own (the capi module's hash, and
        # so its binaries, stay as they are), for tests/deploy/test_clusterctl.py
        Binary("clusterctl", "clusterctl", "sigs.k8s.io/cluster-api/cmd/clusterctl", CAPI_VERSION_FLAGS),
        Binary(
            "machine-controller-manager",
            "mcm",
            "github.com/gardener/machine-controller-manager/cmd/machine-controller-manager",
            MCM_VERSION_FLAGS,
        ),
        Binary(
            "static-hosts-machine-controller",
            "mcm",
            "inplace-extension.invalid/kubelab/mcm/cmd/static-hosts-machine-controller",
            MCM_VERSION_FLAGS,
        ),
        # the lab's CAPA manager (CAPA v2.8.4's own AWSMachine controller and webhooks, a main of the lab's
        # own: CAPA's main.go does not build from the proxy; labs/kubelab/go/capa/go.mod says why), for
        # tests/capi_lab/test_capi_capa.py against moto
        Binary("capa-lab-manager", "capa", "inplace-extension.invalid/kubelab/capa/cmd/capa-lab-manager"),
        # promtool, Prometheus' rule checker and rule unit tester, for tests/deploy/test_alert_rules.py.
        # remove_all_sd leaves out every service discovery plugin but file and http (Prometheus'
        # plugins/plugin_*.go): promtool's rule commands need none of them, and the build is smaller.
        Binary(
            "promtool",
            "promtool",
            "github.com/prometheus/prometheus/cmd/promtool",
            (f"-X github.com/prometheus/common/version.Version={PROMETHEUS_VERSION.lstrip('v')}",),
            ("remove_all_sd",),
        ),
        *(
            binary
            for version in (MINOR_UPGRADE_VERSION, *NODE_VERSIONS)
            for binary in _node_binaries(version)
        ),
        # the first node version's control plane, from its node module (Go's build cache shared with its
        # kubelet); the last node version's is kubelab's own (the k8s module, KUBERNETES_VERSION)
        *_node_binaries(NODE_VERSIONS[0], CONTROL_PLANE),
    )
}
NODE_BINARIES = tuple(
    f"{name}-{version}"
    for version in (MINOR_UPGRADE_VERSION, *NODE_VERSIONS)
    for name in ("kubelet", "kubeadm")
)
CORE_BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kubectl", "kwok")
# what a kubeadm control plane on the lab's nodes needs, upgraded in place from the first node version to
# the last: both versions' components, etcd, the kubelets and kubeadms (test_node_control_plane.py)
CONTROL_PLANE_BINARIES = (
    "etcd",
    *(control_plane_binary(c, v) for v in (NODE_VERSIONS[0], NODE_VERSIONS[-1]) for c in CONTROL_PLANE),
    *(f"{name}-{version}" for version in NODE_VERSIONS for name in ("kubelet", "kubeadm")),
)

# The order of `kubelab build --all` (every name of BINARIES, each once), for a cold test run whose kube
# tests start while the build goes on (scripts/test): each lab fixture waits only for its own binaries, and
# the xdist workers take the node, MCM and CAPI units first (tests/conftest.py). Cheapest to a
# waiting worker first: the core every kube test needs, then the MCM unit's two (about 2 min cold) and the
# CAPI flavour's four (about 3.5 min) and CAPA's lab manager (the CAPA module, a CAPI unit; about 3 min),
# then the nodes' kubelets, kubeadms and the older control plane, the minor upgrade's pair (the dearest
# kubelet) last of them (about 9 min in all: the node unit and the CAPI workload module wait for every one
# of them), last what only two deploy tests use (the cold figures: docs/development.md "CI time").
BUILD_ORDER = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kubectl",
    "kwok",
    "machine-controller-manager",
    "static-hosts-machine-controller",
    "capi-core",
    "capi-kcp",
    "capi-cabpk",
    "capd",
    # CAPA's lab manager right after the CAPI flavour's four: the CAPA module is the first CAPI unit handed
    # out (by name), so a worker waits for it at the start of the kube tests; after the nodes' set it held
    # a worker 13 of its 15 minutes in the fresh run of 27d62e4 (30 when it came second to last, a5e6d77),
    # while the node unit waits for the nodes' set anyway (docs/development.md "CI time")
    "capa-lab-manager",
    *(f"{name}-{NODE_VERSIONS[0]}" for name in ("kubelet", "kubeadm", *CONTROL_PLANE)),
    *(
        f"{name}-{version}"
        for version in (*NODE_VERSIONS[1:], MINOR_UPGRADE_VERSION)
        for name in ("kubelet", "kubeadm")
    ),
    "clusterctl",
    "promtool",
)

Progress = Callable[[str], None]


# The flags of every go command kubelab runs; scripts/test's go vet + go test of our mcm module use the same
# (tests/test_ci_script.py holds them equal), so on a fresh machine they find the packages the build compiled
# instead of compiling them again (measured with an empty GOCACHE after the build: 222 -> 64 s of CPU).
# -dwarf=false: no debug information. -w drops it at the link anyway, and not writing it at each compile
# takes about a fifth off a cold build's CPU (measured on kwok with an empty GOCACHE: 140 -> 112 s of user
# CPU, 90 -> 72 s of wall on 2 cores; docs/development.md "CI time"). A binary built before it is a build of
# the same pinned source with the same optimisations, its bytes laid out a little apart, so the cache keeps
# it (BUILD_FORMAT unchanged: no warm machine rebuilds 24 binaries for this).
GOFLAGS = "-trimpath -buildvcs=false -mod=readonly -gcflags=all=-dwarf=false"


def go_env(cfg: Config) -> dict[str, str]:
    env = dict(os.environ)
    env.update(GOTOOLCHAIN="local", CGO_ENABLED="0", GOFLAGS=GOFLAGS)
    return env


def _go_version(cfg: Config) -> str:
    try:
        return _go(cfg, ["env", "GOVERSION"], Path("/"), go_env(cfg), timeout=60).strip()
    except LabError as exc:
        raise LabError(f"kubelab needs Go (KUBELAB_GO={cfg.go}) to build its binaries: {exc}") from exc


def module_dir(module: str) -> Path:
    return GO_MODULES_DIR / module


def module_hash(module: str, go_version: str) -> str:
    """Content hash of a wrapper module: its files, the recipes of its binaries, the Go version."""
    digest = hashlib.sha256(f"format={BUILD_FORMAT} go={go_version}\n".encode())
    root = module_dir(module)
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(f"{path.relative_to(root)}\n".encode())
        digest.update(path.read_bytes())
    for binary in sorted((b for b in BINARIES.values() if b.module == module), key=lambda b: b.name):
        recipe = f"{binary.name} {binary.package} {' '.join(binary.ldflags)}"
        # tags only when there are any: the hashes of the tagless binaries (and so their caches) stay
        if binary.tags:
            recipe += f" tags={','.join(binary.tags)}"
        digest.update(f"{recipe}\n".encode())
    return digest.hexdigest()[:16]


def binary_path(cfg: Config, name: str, go_version: str) -> Path:
    binary = BINARIES[name]
    return cfg.bin_root / f"{binary.module}-{module_hash(binary.module, go_version)}" / name


def _build_one(cfg: Config, binary: Binary, target: Path, progress: Progress) -> None:
    log = cfg.cache_dir / "logs" / f"{binary.name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.partial")
    argv = [
        cfg.go,
        "build",
        "-ldflags",
        " ".join(("-s", "-w", *binary.ldflags)),
        *(("-tags", ",".join(binary.tags)) if binary.tags else ()),
        "-o",
        str(partial),
        binary.package,
    ]
    progress(f"kubelab build: {binary.name} ({binary.package}) ...")
    started = time.monotonic()
    with log.open("w") as out:
        out.write(f"# in {module_dir(binary.module)}: {' '.join(argv)}\n")
        out.flush()
        try:
            proc = subprocess.run(
                argv,
                cwd=module_dir(binary.module),
                env=go_env(cfg),
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=BUILD_TIMEOUT,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise LabError(
                f"kubelab build: {binary.name} timed out after {BUILD_TIMEOUT:g}s, log: {log}"
            ) from exc
    if proc.returncode != 0:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
        raise LabError(
            f"kubelab build: go build of {binary.name} failed (exit {proc.returncode}), log: {log}\n{tail}"
        )
    partial.rename(target)
    progress(f"kubelab build: {binary.name} done in {time.monotonic() - started:.0f}s -> {target}")


def ensure_built(names: Iterable[str], cfg: Config, progress: Progress = print) -> dict[str, Path]:
    """Build every binary of ``names`` that is not in the cache yet, in the order given, each under the
    build lock; return name -> path for all of them. A binary another process is building is waited for,
    never built twice."""
    wanted = list(dict.fromkeys(names))
    unknown = [n for n in wanted if n not in BINARIES]
    if unknown:
        raise LabError(f"kubelab build: unknown binaries {unknown}; known: {sorted(BINARIES)}")
    go_version = _go_version(cfg)
    paths = {name: binary_path(cfg, name, go_version) for name in wanted}
    lock = cfg.cache_dir / "build.lock"
    for name, path in paths.items():
        if path.is_file():
            continue  # the warm path: no lock file is touched
        # flock(2) is not fair: a process building a batch takes the lock again at once after each binary,
        # so a waiter would rarely get it between two; it also looks at its own binary (unless) and goes on
        # as soon as that process has built it
        with file_lock(
            lock,
            timeout=BUILD_TIMEOUT * 2,
            what="kubelab build lock",
            on_wait=partial(progress, f"kubelab build: waiting for {name}, another build holds {lock}"),
            unless=path.is_file,
        ) as held:
            if held and not path.is_file():  # held, and not built by the holder we waited for
                _build_one(cfg, BINARIES[name], path, progress)
    return paths


def cached(names: Iterable[str], cfg: Config) -> dict[str, Path]:
    """The built binaries of ``names`` without building (``scripts/serve`` and ``kubelab up --no-build``)."""
    go_version = _go_version(cfg)
    paths = {name: binary_path(cfg, name, go_version) for name in names}
    missing = sorted(n for n, p in paths.items() if not p.is_file())
    if missing:
        raise LabError(f"kubelab: not built yet: {', '.join(missing)} (run `kubelab build`)")
    return paths


def not_built(names: Iterable[str], cfg: Config) -> list[str]:
    """The binaries of ``names`` that a build would build now (not in the cache), in build order; nothing
    is built. ``scripts/test`` asks it to decide whether the build runs beside the tests that need none."""
    wanted = list(dict.fromkeys(names))
    unknown = [n for n in wanted if n not in BINARIES]
    if unknown:
        raise LabError(f"kubelab build: unknown binaries {unknown}; known: {sorted(BINARIES)}")
    go_version = _go_version(cfg)
    return [name for name in wanted if not binary_path(cfg, name, go_version).is_file()]


# Upstream files read as data at run time (never copied into the repository), pinned by their checksum.
DATA_MODULES: dict[str, tuple[str, str, str]] = {
    "cert-manager": (
        "github.com/cert-manager/cert-manager",
        "v1.19.1",
        "h1:Txh8L/nLWTDcb7ZnXuXbTe15BxQnLbLirXmbNk0fGgY=",
    ),
}


def _go(cfg: Config, args: list[str], cwd: Path, env: dict[str, str], timeout: float = 600) -> str:
    """Run a quick ``go`` command (not a build) and return stdout; failures name the command and stderr."""
    try:
        proc = subprocess.run(
            [cfg.go, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise LabError(f"kubelab: go {' '.join(args)} (in {cwd}) failed: {exc}") from exc
    if proc.returncode != 0:
        raise LabError(f"kubelab: go {' '.join(args)} (in {cwd}) failed: {proc.stderr.strip()}")
    return proc.stdout


def module_source(cfg: Config, module: str, path: str) -> Path:
    """The source directory of ``path`` as the wrapper module ``module`` pins it (downloaded if needed)."""
    cwd = module_dir(module)
    _go(cfg, ["mod", "download", path], cwd, go_env(cfg))
    out = _go(cfg, ["list", "-m", "-f", "{{.Dir}}", path], cwd, go_env(cfg)).strip()
    if not out or not Path(out).is_dir():
        raise LabError(f"kubelab: the Go module cache has no source of {path} (module {cwd})")
    return Path(out)


def data_module(cfg: Config, key: str) -> Path:
    """Download a DATA_MODULES entry (outside any module), check its checksum, return its directory."""
    path, version, expected = DATA_MODULES[key]
    cfg.cache_dir.mkdir(parents=True, exist_ok=True)
    env = go_env(cfg) | {"GOFLAGS": "-mod=mod", "GO111MODULE": "on"}
    info = json.loads(_go(cfg, ["mod", "download", "-json", f"{path}@{version}"], cfg.cache_dir, env))
    if info.get("Sum") != expected:
        raise LabError(f"kubelab: {path}@{version} has checksum {info.get('Sum')}, expected {expected}")
    return Path(info["Dir"])
