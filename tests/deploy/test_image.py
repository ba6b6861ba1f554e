"""The image, built and run for real: ``podman build`` of the Dockerfile on a Debian base made here, the
container run as ``deploy/deployment.yaml`` runs it (its mounts, environment and security context), and
CAPI's calls answered over HTTPS from inside it.

What is a stand-in: the base image (Debian's python3 instead of the official python image, which cannot
be pulled here; tests/deploy/image.py) and the Secrets' contents (a test CA's serving certificate, a
fresh SSH key, the example inventory). The build, the image, the runtime (runc) and the service are real.
"""

from __future__ import annotations

import json
import ssl
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import trustme
from starlette.testclient import TestClient

from inplace_extension.app import create_app
from inplace_extension.settings import Settings

from .image import EngineError, Podman, base_image, missing_tools, service_image
from .podrun import PodIdentity, PodRun, pod_run
from .support import DEPLOY, ROOT, one, rendered

pytestmark = pytest.mark.image

FIXTURES = ROOT / "tests" / "fixtures" / "capi"
API = "/hooks.runtime.cluster.x-k8s.io/v1alpha1"
SERVICE_DNS = "inplace-extension.inplace-extension-system.svc"
READY_TIMEOUT = 60.0
# podman on this machine kind: without explicit limits runc cannot apply the runtime's defaults; the
# HEALTHCHECK is run on demand (its timer would need systemd)
RUN_OPTIONS = ("--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024", "--health-interval", "disable")


@dataclass
class Running:
    podman: Podman
    id: str
    run: PodRun
    client: httpx.Client
    url: str

    def pid(self) -> int:
        return int(self.podman.run("inspect", "--format", "{{.State.Pid}}", self.id).strip())

    def exec(self, *argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.podman.argv("exec", self.id, *argv), capture_output=True, text=True, timeout=60, check=False
        )


@pytest.fixture(scope="module")
def podman() -> Podman:
    from hostlab.pytest_plugin import required

    why = missing_tools()
    if why:
        required("image", why)
    return Podman()


@pytest.fixture(scope="module")
def image(podman: Podman) -> str:
    """The Dockerfile built on the local Debian base: the same image the node tests import into the real
    nodes, built once per content (tests/deploy/image.py)."""
    try:
        return service_image(podman)
    except EngineError as exc:
        pytest.fail(f"podman build failed: {exc}", pytrace=False)


def _secrets(tmp: Path) -> tuple[dict[str, dict[str, bytes]], Path]:
    ca = trustme.CA()
    cert = ca.issue_cert(SERVICE_DNS, "127.0.0.1")
    ca_file = tmp / "ca.crt"
    ca.cert_pem.write_to_path(str(ca_file))
    key = tmp / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True, timeout=30)
    secrets = {
        "inplace-extension-serving-cert": {
            "tls.crt": cert.cert_chain_pems[0].bytes(),
            "tls.key": cert.private_key_pem.bytes(),
            "ca.crt": ca.cert_pem.bytes(),
        },
        "inplace-extension-ssh": {"id_ed25519": key.read_bytes()},
        "inplace-extension-inventory": {
            "inventory.yaml": (DEPLOY / "examples" / "inventory.yaml").read_bytes()
        },
    }
    return secrets, ca_file


def _probe_url(run: PodRun, probe: dict[str, Any]) -> str:
    get = probe["httpGet"]
    assert get["scheme"] == "HTTPS"
    return f"https://127.0.0.1:{run.ports[str(get['port'])]}{get['path']}"


@pytest.fixture(scope="module")
def container(podman: Podman, image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    """The image run as deploy/'s Deployment runs it, until its readinessProbe answers 200."""
    work = tmp_path_factory.mktemp("container")
    secrets, ca_file = _secrets(work)
    config_maps = {d["metadata"]["name"]: d.get("data", {}) for d in rendered() if d["kind"] == "ConfigMap"}
    deployment = one("Deployment", "inplace-extension")
    pod = PodIdentity("inplace-extension-image-test", deployment["metadata"]["namespace"])
    # The one deviation from the manifest: the local executor. deploy/ runs the kubernetes executor,
    # which needs the API server and this Pod's object to start; there is no cluster around this
    # container. The kubernetes executor's Jobs run from this image on the lab's real nodes
    # (tests/nodes/test_node_pods.py, test_node_jobs.py).
    overrides = {"INPLACE_EXECUTOR": "local"}
    run = pod_run(deployment, config_maps, secrets, work / "volumes", pod, overrides)
    container_id = podman.run("run", "--detach", *RUN_OPTIONS, *run.options, image, *run.args).strip()
    client = httpx.Client(verify=ssl.create_default_context(cafile=str(ca_file)), timeout=10)
    ready = _probe_url(run, run.container["readinessProbe"])
    try:
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            try:
                if client.get(ready).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                logs = podman.run("logs", container_id)
                pytest.fail(
                    f"the container did not get ready within {READY_TIMEOUT:g}s:\n{logs}", pytrace=False
                )
            time.sleep(0.2)
        yield Running(podman, container_id, run, client, ready.rsplit("/", 1)[0])
    finally:
        client.close()
        podman.run("rm", "--force", "--time", "10", container_id, timeout=60)


def _in_process(path: str, body: bytes) -> dict[str, Any]:
    """What the same code answers outside the image (plain HTTP, in this process)."""
    with TestClient(create_app(Settings(plain_http=True))) as client:
        answer: dict[str, Any] = client.post(path, content=body).json()
        return answer


def test_the_image_is_built_on_the_base_image_given_as_build_argument(podman: Podman, image: str) -> None:
    def layers(ref: str) -> list[str]:
        return list(json.loads(podman.run("image", "inspect", "--format", "{{json .RootFS.Layers}}", ref)))

    base = layers(base_image(podman))
    built = layers(image)
    assert built[: len(base)] == base and len(built) > len(base)


def test_discovery_over_https_lists_the_three_hooks(container: Running) -> None:
    body = (FIXTURES / "discovery" / "request.json").read_bytes()
    response = container.client.post(f"{container.url}{API}/discovery", content=body)
    assert response.status_code == 200
    answer = response.json()
    assert answer["status"] == "Success"
    assert {h["requestHook"]["hook"] for h in answer["handlers"]} == {
        "CanUpdateMachine",
        "CanUpdateMachineSet",
        "UpdateMachine",
    }
    assert answer == _in_process(f"{API}/discovery", body)


def test_can_update_machine_set_answers_with_patches_from_inside_the_image(container: Running) -> None:
    path = f"{API}/canupdatemachineset/can-update-machineset"
    body = (FIXTURES / "can_update_machine_set" / "5A.request.json").read_bytes()
    response = container.client.post(f"{container.url}{path}", content=body)
    assert response.status_code == 200
    answer = response.json()
    assert answer["status"] == "Success", answer
    assert answer["machineSetPatch"]["patch"], answer
    assert answer == _in_process(path, body)


def test_a_wrong_body_gets_a_failure_not_a_500(container: Running) -> None:
    path = f"{API}/canupdatemachineset/can-update-machineset"
    response = container.client.post(f"{container.url}{path}", content=b'{"kind": 1')
    assert response.status_code == 200
    assert response.json()["status"] == "Failure"


def test_runs_as_the_non_root_user_the_image_and_the_manifest_name(container: Running, image: str) -> None:
    uid, gid = container.run.user
    assert uid != 0 and gid != 0
    image_user = container.podman.run("image", "inspect", "--format", "{{.Config.User}}", image).strip()
    assert image_user == f"{uid}:{gid}"
    status = Path(f"/proc/{container.pid()}/status").read_text()
    fields = {line.split(":")[0]: line.split()[1:] for line in status.splitlines()}
    assert fields["Uid"] == [str(uid)] * 4
    assert fields["Gid"] == [str(gid)] * 4
    assert fields["CapEff"] == ["0000000000000000"]
    assert fields["NoNewPrivs"] == ["1"]


def test_root_filesystem_is_read_only_and_only_the_manifests_volumes_are_writable(
    container: Running,
) -> None:
    writable = [m["mountPath"] for m in container.run.container["volumeMounts"] if not m.get("readOnly")]
    probe = (
        "import errno, sys\n"
        "for d in sys.argv[1:]:\n"
        "    try:\n"
        "        open(d + '/.probe', 'w').close()\n"
        "        print(d, 'ok')\n"
        "    except OSError as e:\n"
        "        print(d, errno.errorcode[e.errno])\n"
    )
    dirs = ["/", "/opt/inplace-extension/playbooks", "/etc", "/var/tmp", *writable]
    result = container.exec("python", "-c", probe, *dirs)
    assert result.returncode == 0, result.stderr
    outcome = dict(line.split() for line in result.stdout.splitlines())
    assert outcome == {**{d: "EROFS" for d in dirs if d not in writable}, **{d: "ok" for d in writable}}
    mounts = Path(f"/proc/{container.pid()}/mountinfo").read_text().splitlines()
    root = next(line.split() for line in mounts if line.split()[4] == "/")
    assert "ro" in root[5].split(",")


def test_the_images_healthcheck_passes_in_the_running_container(container: Running) -> None:
    check = container.podman.run("inspect", "--format", "{{json .Config.Healthcheck.Test}}", container.id)
    assert json.loads(check)[0] == "CMD"  # the Dockerfile's HEALTHCHECK survived the build
    result = subprocess.run(
        container.podman.argv("healthcheck", "run", container.id),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
