"""Bootstrap data in CABPK's format, for the lab provider's tests: a document laid out exactly as CAPI
v1.14.2's ``bootstrap/kubeadm/pkg/cloudinit`` templates render a worker's (``nodeCloudInit``: the header,
the user's files with ``encoding``/``owner``/``permissions``/``append``, the join configuration, the
``/run/cluster-api`` placeholder, ``runcmd`` with the pre-kubeadm commands quoted by ``%q`` and the
kubeadm command ``&& echo success > /run/cluster-api/bootstrap-success.complete``), and the Secret CABPK
stores it in (``data.value``, ``data.format``, type ``cluster.x-k8s.io/secret``). Written by the test,
not made by the real CABPK; the kubeadm command is the test's own (``kubeadm_command``) until the nodes
join a cluster this way.
"""

from __future__ import annotations

import base64
import gzip
import json
from typing import Any

import yaml

SENTINEL_COMMAND = "echo success > /run/cluster-api/bootstrap-success.complete"  # CABPK's sentinelFileCommand
PLACEHOLDER = (
    "This placeholder file is used to create the /run/cluster-api sub directory in a way that is compatible"
    " with both Linux and Windows (mkdir -p /run/cluster-api does not work with Windows)"
)
GZIPPED = b"gzip+base64 content\n"
BASE64 = b"base64 content: \x00\x01 bytes\n"


def _indent(text: str, spaces: int) -> str:
    return "\n".join(" " * spaces + line for line in text.splitlines())


def join_configuration(discovery: dict[str, Any] | None = None) -> str:
    """The JoinConfiguration (kubeadm v1beta4) as CABPK marshals it: the node named and its kubelet given
    the provider ID through the jinja metadata, as users write them in a KubeadmConfig(Template)."""
    config: dict[str, Any] = {
        "apiVersion": "kubeadm.k8s.io/v1beta4",
        "kind": "JoinConfiguration",
        "nodeRegistration": {
            "name": "{{ ds.meta_data.local_hostname }}",
            "kubeletExtraArgs": [{"name": "provider-id", "value": "lab://{{ ds.meta_data.local_hostname }}"}],
        },
    }
    if discovery is not None:
        config["discovery"] = discovery
        config["nodeRegistration"]["criSocket"] = "unix:///var/run/containerd/containerd.sock"
        # kubeadm preflight fails on a systemd-nspawn node of a cgroup v1 machine (as in kubelab.node_join)
        config["nodeRegistration"]["ignorePreflightErrors"] = ["all"]
    return yaml.safe_dump(config, sort_keys=True)


# a KubeadmConfig's ntp and users as CABPK's templates render them (ntp.go, users.go), after runcmd
PASSWD = "$6$labsalt$notTheHashOfAnyPasswordTheTestsLogInWithKeys"  # the shape of a crypt(3) hash
KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeKeyForTheLabProviderTests0000000000 alice@lab"
USERS_AND_NTP = f"""ntp:
  enabled: true
  servers:
    - ntp1.example.org
    - 192.0.2.7
users:
  - name: alice
    gecos: Alice of the lab
    groups: adm,labteam
    lock_passwd: true
    shell: /bin/bash
    sudo: ALL=(ALL) NOPASSWD:ALL
    ssh_authorized_keys:
      - {KEY}
  - name: bob
    passwd: {PASSWD}
    lock_passwd: false
"""


def worker_document(
    kubeadm_command: str, pre_kubeadm: tuple[str, ...] = (), join: str | None = None, tail: str = ""
) -> str:
    """A worker's cloud-config as CABPK renders it, with three user files (plain 0600 owned by nobody with
    append, base64, gzip+base64), the join configuration (``join``, else :func:`join_configuration`) and
    ``tail`` after runcmd (where CABPK puts ntp and users: :data:`USERS_AND_NTP`)."""
    gz = base64.b64encode(gzip.compress(GZIPPED, mtime=0)).decode()
    b64 = base64.b64encode(BASE64).decode()
    join = join or join_configuration()
    runcmd = "".join(f"\n  - {json.dumps(c)}" for c in pre_kubeadm)  # Go's %q, for ASCII text
    return f"""## template: jinja
#cloud-config

write_files:
-   path: /etc/lab-test/plain.conf
    owner: nobody:nogroup
    permissions: '0600'
    append: true
    content: |
      plain line for {{{{ ds.meta_data.hostname }}}}
-   path: /etc/lab-test/base64.bin
    encoding: "base64"
    owner: root:root
    permissions: '0640'
    content: |
      {b64}
-   path: /etc/lab-test/deep/gzip.txt
    encoding: "gzip+base64"
    permissions: '0755'
    content: |
      {gz}
-   path: /run/kubeadm/kubeadm-join-config.yaml
    owner: root:root
    permissions: '0640'
    content: |
      ---
{_indent(join, 6)}
-   path: /run/cluster-api/placeholder
    owner: root:root
    permissions: '0640'
    content: "{PLACEHOLDER}"
runcmd:{runcmd}
  - {kubeadm_command} && {SENTINEL_COMMAND}
{tail}"""


def secret(name: str, namespace: str, document: str, cluster: str) -> dict[str, Any]:
    """The bootstrap data Secret as CABPK writes it."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "cluster.x-k8s.io/secret",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"cluster.x-k8s.io/cluster-name": cluster},
        },
        "data": {
            "value": base64.b64encode(document.encode()).decode(),
            "format": base64.b64encode(b"cloud-config").decode(),
        },
    }
