"""The lab provider reads CABPK's cloud-config as cloud-init would (lab-free): the jinja header's metadata
rendered with the node's name and address, files decoded with their modes and owners, runcmd as
cloud-init's script, users and ntp servers with cloud-init's defaults; and bad or unsupported bootstrap
data refused with a message that says what and where."""

from __future__ import annotations

import base64
import dataclasses

import pytest
from kubelab.labprovider import cloudconfig
from kubelab.labprovider.cloudconfig import BootstrapDataError

from .cabpk import (
    BASE64,
    GZIPPED,
    KEY,
    PASSWD,
    PLACEHOLDER,
    SENTINEL_COMMAND,
    USERS_AND_NTP,
    secret,
    worker_document,
)


def test_a_cabpk_worker_document_becomes_files_and_a_runcmd_script() -> None:
    document = worker_document("kubeadm join --config /run/kubeadm/kubeadm-join-config.yaml", ("hostname x",))
    text = cloudconfig.secret_document(secret("w-1", "ns", document, "c"))
    bootstrap = cloudconfig.parse(text, "hl3h2", "10.10.0.3")
    files = {f.path: f for f in bootstrap.files}
    plain = files["/etc/lab-test/plain.conf"]
    assert (plain.content, plain.permissions, plain.owner, plain.append) == (
        b"plain line for hl3h2\n",
        0o600,
        "nobody:nogroup",
        True,
    )
    assert (files["/etc/lab-test/base64.bin"].content, files["/etc/lab-test/base64.bin"].permissions) == (
        BASE64,
        0o640,
    )
    gz = files["/etc/lab-test/deep/gzip.txt"]
    assert (gz.content, gz.permissions, gz.owner, gz.append) == (GZIPPED, 0o755, "root:root", False)
    join = files["/run/kubeadm/kubeadm-join-config.yaml"].content.decode()
    assert "name: 'hl3h2'" in join and "value: lab://hl3h2" in join and "{{" not in join
    assert files["/run/cluster-api/placeholder"].content == PLACEHOLDER.encode()
    assert bootstrap.runcmd == (
        "#!/bin/sh\nhostname x\n"
        f"kubeadm join --config /run/kubeadm/kubeadm-join-config.yaml && {SENTINEL_COMMAND}\n"
    )
    assert bootstrap.bootcmd is None
    assert (bootstrap.users, bootstrap.ntp_servers) == ((), ())


def test_cabpks_users_and_ntp_are_read_with_cloud_inits_defaults() -> None:
    bootstrap = cloudconfig.parse(worker_document("kubeadm join", tail=USERS_AND_NTP), "n1", "10.10.0.2")
    alice = {
        "name": "alice",
        "groups": ("adm", "labteam"),
        "primary_group": None,
        "gecos": "Alice of the lab",
        "homedir": None,
        "shell": "/bin/bash",
        "passwd": None,
        "lock_passwd": True,
        "inactive": False,
        "sudo": ("ALL=(ALL) NOPASSWD:ALL",),
        "ssh_authorized_keys": (KEY,),
    }
    assert [dataclasses.asdict(u) for u in bootstrap.users] == [
        alice,
        # cloud-init locks a password unless told not to; bob's was
        {**{k: None for k in alice}, "name": "bob", "groups": (), "sudo": (), "ssh_authorized_keys": ()}
        | {"passwd": PASSWD, "lock_passwd": False, "inactive": False},
    ]
    assert bootstrap.ntp_servers == ("ntp1.example.org", "192.0.2.7")
    assert "user alice" in cloudconfig.describe(bootstrap)
    # ntp without enabled is enabled (cloud-init's default); enabled false writes no servers
    assert cloudconfig.parse(
        "#cloud-config\nntp:\n  servers: [a.example]\n", "n1", "10.10.0.2"
    ).ntp_servers == ("a.example",)
    assert (
        cloudconfig.parse(
            "#cloud-config\nntp: {enabled: false, servers: [a]}\n", "n1", "10.10.0.2"
        ).ntp_servers
        == ()
    )
    # groups as a list, sudo as a list of rules, inactive
    listed = "#cloud-config\nusers:\n- {name: c, groups: [a, b], sudo: [r1, r2], inactive: true}\n"
    user = cloudconfig.parse(listed, "n1", "10.10.0.2").users[0]
    assert (user.groups, user.sudo, user.inactive) == (("a", "b"), ("r1", "r2"), True)


def test_the_local_ipv4_expression_is_the_nodes_address() -> None:
    # a joining control plane's advertiseAddress, where kubeadm finds no default route to take it from
    join = "controlPlane:\n  localAPIEndpoint:\n    advertiseAddress: '{{ ds.meta_data.local_ipv4 }}'\n"
    document = (
        "## template: jinja\n#cloud-config\nwrite_files:\n- path: /run/kubeadm/kubeadm-join-config.yaml\n"
        f"  content: {join!r}\n"
    )
    bootstrap = cloudconfig.parse(document, "hl3h4", "10.10.0.5")
    assert bootstrap.files[0].content.decode() == join.replace("{{ ds.meta_data.local_ipv4 }}", "10.10.0.5")


def test_list_entries_are_quoted_words_and_a_document_without_the_header_is_not_rendered() -> None:
    text = "#cloud-config\nbootcmd:\n- [echo, 'a b', \"$HOME\"]\nruncmd:\n- echo '{{ v1.local_hostname }}'\n"
    bootstrap = cloudconfig.parse(text, "n1", "10.10.0.2")
    assert bootstrap.bootcmd == "#!/bin/sh\necho 'a b' '$HOME'\n"
    assert (
        bootstrap.runcmd == "#!/bin/sh\necho '{{ v1.local_hostname }}'\n"
    )  # no header: cloud-init renders nothing


@pytest.mark.parametrize(
    ("document", "message"),
    [
        (
            "## template: jinja\n#cloud-config\nruncmd: ['{{ ds.meta_data.region }}']\n",
            "'{{ ds.meta_data.region }}' is not one",
        ),
        (
            "## template: jinja\n#cloud-config\nruncmd: ['{% if x %}y{% endif %}']\n",
            "line 3: template syntax '{%'",
        ),
        ("#!/bin/sh\necho hi\n", "not a cloud-config document: its first line is '#!/bin/sh'"),
        ("#cloud-config\nruncmd: [\n", "not valid YAML"),
        ("#cloud-config\ndisk_setup: {a: b}\nmounts: [[a, b]]\n", "does not carry out disk_setup, mounts"),
        ("#cloud-config\nusers: {name: a}\n", "users is not a list"),
        ("#cloud-config\nusers:\n- name: Alice\n", "users[0].name: 'Alice' is not a POSIX user"),
        ("#cloud-config\nusers:\n- {name: a}\n- {name: a}\n", "users: a name is listed twice"),
        ("#cloud-config\nusers:\n- {name: a, uid: 0}\n", "users[0]: unknown key uid"),
        ("#cloud-config\nusers:\n- {name: a, groups: 'x,Y;'}\n", "users[0] (a).groups[1]: 'Y;' is not"),
        ("#cloud-config\nusers:\n- {name: a, shell: bin/sh}\n", "(a).shell: 'bin/sh' is not an absolute"),
        ("#cloud-config\nusers:\n- {name: a, homedir: /home/../etc}\n", "(a).homedir: '/home/../etc'"),
        (
            '#cloud-config\nusers:\n- {name: a, sudo: "ALL\\nroot ALL"}\n',
            "(a).sudo[0] is not a string of one line",
        ),
        ("#cloud-config\nusers:\n- {name: a, passwd: 'x:y'}\n", "(a).passwd is not a string of one line"),
        ("#cloud-config\nusers:\n- {name: a, lock_passwd: 'no'}\n", "(a).lock_passwd: 'no' is not true"),
        ("#cloud-config\nusers:\n- {name: a, ssh_authorized_keys: k}\n", "ssh_authorized_keys is not a list"),
        ("#cloud-config\nntp: {servers: ['a b']}\n", "ntp.servers[0]: 'a b' is not a host name"),
        ("#cloud-config\nntp: {pools: [p]}\n", "ntp: unknown key pools"),
        (
            "#cloud-config\nwrite_files:\n- {path: rel/path}\n",
            "write_files[0]: path must be an absolute path",
        ),
        (
            "#cloud-config\nwrite_files:\n- {path: /a, encoding: zstd}\n",
            "write_files[0] (/a): unknown encoding 'zstd'",
        ),
        (
            "#cloud-config\nwrite_files:\n- {path: /a, encoding: base64, content: '!!'}\n",
            "(/a): content is not valid base64",
        ),
        (
            "#cloud-config\nwrite_files:\n- {path: /a, encoding: gzip, content: abc}\n",
            "(/a): content is not valid gzip",
        ),
        (
            "#cloud-config\nwrite_files:\n- {path: /a, permissions: 'rw-'}\n",
            "(/a): permissions 'rw-' is not an octal mode",
        ),
        ("#cloud-config\nwrite_files:\n- {path: /a, owner: 'a;b'}\n", "(/a): owner 'a;b' is not"),
        ("#cloud-config\nwrite_files:\n- {path: /a, defer: true}\n", "(/a): unknown key defer"),
        ("#cloud-config\nruncmd: [{a: b}]\n", "runcmd[0] is neither a string nor a list of words"),
    ],
)
def test_bad_or_unsupported_bootstrap_data_is_refused_with_what_and_where(
    document: str, message: str
) -> None:
    with pytest.raises(BootstrapDataError) as caught:
        cloudconfig.parse(document, "n1", "10.10.0.2")
    assert message in str(caught.value)


def test_a_secret_in_another_format_or_without_a_value_is_refused() -> None:
    ignition = {
        "data": {"value": base64.b64encode(b"{}").decode(), "format": base64.b64encode(b"ignition").decode()}
    }
    with pytest.raises(
        BootstrapDataError, match="format 'ignition': the lab provider reads only cloud-config"
    ):
        cloudconfig.secret_document(ignition)
    with pytest.raises(BootstrapDataError, match=r"no data\.value"):
        cloudconfig.secret_document({"data": {}})
    with pytest.raises(BootstrapDataError, match=r"data\.value is not base64 text"):
        cloudconfig.secret_document({"data": {"value": "%%%"}})
