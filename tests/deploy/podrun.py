"""``deploy/``'s Deployment run as a podman container: what the kubelet would do, read from the manifest.

:func:`pod_run` turns the rendered Deployment's only container into ``podman run`` arguments, so the
image test runs the image exactly as the manifest asks and notices when the manifest changes:

- each ``volumeMount``: a ``secret`` volume becomes a directory of the Secret's files (owner root, group
  ``fsGroup``, the volume's ``defaultMode``; the test supplies the contents by Secret name), an
  ``emptyDir`` a directory owned by root, writable by ``fsGroup`` (setgid, as the kubelet makes it);
  ``readOnly`` mounts are read-only;
- ``env`` values, the ConfigMaps of ``envFrom`` and the downward API's ``metadata.name`` and
  ``metadata.namespace`` (the Pod's identity the test gives, as the kubelet fills them in); the test may
  override named variables (``env_overrides``), each such deviation from the manifest said at its call;
- ``securityContext``: ``runAsUser``/``runAsGroup`` -> ``--user``, ``fsGroup`` -> ``--group-add``,
  ``readOnlyRootFilesystem`` -> ``--read-only`` with no extra tmpfs (only the manifest's volumes are
  writable), ``allowPrivilegeEscalation: false`` -> ``no-new-privileges``, ``capabilities.drop``;
- each ``containerPort`` published on a free loopback port; ``args`` after the image.

What a manifest field means that this module does not know raises, so a new field is a test failure
to handle here, not something silently ignored.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_SECRET_MODE = 0o644  # Kubernetes' defaultMode of a secret volume
EMPTY_DIR_MODE = 0o2770
KNOWN_VOLUME_KINDS = ("secret", "emptyDir")
KNOWN_CONTAINER_SECURITY = {
    "allowPrivilegeEscalation",
    "readOnlyRootFilesystem",
    "privileged",
    "capabilities",
}
KNOWN_POD_SECURITY = {"runAsNonRoot", "runAsUser", "runAsGroup", "fsGroup", "seccompProfile"}


@dataclass(frozen=True)
class PodIdentity:
    """The Pod the container stands for: what the downward API's ``fieldRef`` reads."""

    name: str
    namespace: str


@dataclass(frozen=True)
class PodRun:
    """``podman run`` options for the container, the published ports and the user it runs as."""

    options: list[str]
    args: list[str]
    ports: dict[str, int]  # container port name (or number) -> loopback port on this machine
    user: tuple[int, int]
    container: dict[str, Any]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _only_container(deployment: Mapping[str, Any]) -> dict[str, Any]:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    if len(containers) != 1:
        raise AssertionError(f"expected one container in the Deployment, found {len(containers)}")
    container: dict[str, Any] = containers[0]
    return container


def _env(
    container: Mapping[str, Any],
    config_maps: Mapping[str, Mapping[str, str]],
    pod: PodIdentity,
    overrides: Mapping[str, str],
) -> list[str]:
    values: dict[str, str] = {}
    for source in container.get("envFrom", []):
        name = source["configMapRef"]["name"]
        if name not in config_maps:
            raise AssertionError(f"envFrom names ConfigMap {name!r}, which deploy/ does not render")
        values.update(config_maps[name])
    fields = {"metadata.name": pod.name, "metadata.namespace": pod.namespace}
    for item in container.get("env", []):
        if "value" in item:
            values[item["name"]] = item["value"]
            continue
        path = item.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        if path not in fields:
            raise AssertionError(f"env {item['name']} is neither a plain value nor a known field: {item}")
        values[item["name"]] = fields[path]
    unknown = set(overrides) - set(values)
    if unknown:
        raise AssertionError(f"overrides of variables the manifest does not set: {sorted(unknown)}")
    values.update(overrides)
    return [opt for key, value in values.items() for opt in ("--env", f"{key}={value}")]


def _secret_volume(
    volume: Mapping[str, Any], secrets: Mapping[str, Mapping[str, bytes]], target: Path, group: int
) -> None:
    name = volume["secret"]["secretName"]
    if name not in secrets:
        raise AssertionError(f"the Deployment mounts Secret {name!r}: give the test its contents")
    data = secrets[name]
    items = volume["secret"].get("items") or [{"key": key, "path": key} for key in data]
    default_mode = int(volume["secret"].get("defaultMode", DEFAULT_SECRET_MODE))
    target.mkdir(parents=True)
    os.chown(target, 0, group)
    target.chmod(0o755)
    for item in items:
        path = target / item["path"]
        path.write_bytes(data[item["key"]])
        os.chown(path, 0, group)
        path.chmod(int(item.get("mode", default_mode)))


def pod_run(
    deployment: Mapping[str, Any],
    config_maps: Mapping[str, Mapping[str, str]],
    secrets: Mapping[str, Mapping[str, bytes]],
    volumes_dir: Path,
    identity: PodIdentity,
    env_overrides: Mapping[str, str],
) -> PodRun:
    """The ``podman run`` options for the Deployment's container; volume contents go under ``volumes_dir``;
    ``env_overrides`` replaces the values of variables the manifest sets (a deviation the caller explains)."""
    pod = deployment["spec"]["template"]["spec"]
    container = _only_container(deployment)
    if "command" in container:
        raise AssertionError("the container sets command: map it to podman's --entrypoint here")
    pod_security: dict[str, Any] = pod.get("securityContext", {})
    security: dict[str, Any] = container.get("securityContext", {})
    unknown = (set(pod_security) - KNOWN_POD_SECURITY) | (set(security) - KNOWN_CONTAINER_SECURITY)
    if unknown:
        raise AssertionError(f"securityContext fields this test does not map to podman: {sorted(unknown)}")
    uid = int(security.get("runAsUser", pod_security.get("runAsUser", 0)))
    gid = int(security.get("runAsGroup", pod_security.get("runAsGroup", 0)))
    fs_group = int(pod_security.get("fsGroup", 0))
    options = ["--user", f"{uid}:{gid}"]
    if fs_group:
        options += ["--group-add", str(fs_group)]
    if security.get("readOnlyRootFilesystem"):
        options += ["--read-only", "--read-only-tmpfs=false"]
    if security.get("allowPrivilegeEscalation") is False:
        options += ["--security-opt", "no-new-privileges"]
    if security.get("privileged"):
        options.append("--privileged")
    for cap in security.get("capabilities", {}).get("drop", []):
        options += ["--cap-drop", cap]
    for cap in security.get("capabilities", {}).get("add", []):
        options += ["--cap-add", cap]
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    for mount in container.get("volumeMounts", []):
        volume = volumes[mount["name"]]
        kind = next((k for k in KNOWN_VOLUME_KINDS if k in volume), None)
        if kind is None:
            raise AssertionError(f"volume {mount['name']} is of a kind this test does not map: {volume}")
        source = volumes_dir / mount["name"]
        if kind == "secret":
            _secret_volume(volume, secrets, source, fs_group)
        else:
            source.mkdir(parents=True)
            os.chown(source, 0, fs_group)
            source.chmod(EMPTY_DIR_MODE)
        options += ["--volume", f"{source}:{mount['mountPath']}:{'ro' if mount.get('readOnly') else 'rw'}"]
    options += _env(container, config_maps, identity, env_overrides)
    ports: dict[str, int] = {}
    for port in container.get("ports", []):
        local = _free_port()
        ports[str(port.get("name", port["containerPort"]))] = local
        options += [
            "--publish",
            f"127.0.0.1:{local}:{port['containerPort']}/{port.get('protocol', 'TCP').lower()}",
        ]
    return PodRun(options, list(container.get("args", [])), ports, (uid, gid), container)
