"""The lab provider reads CABPK's cloud-config as cloud-init would (lab-free): the jinja header's metadata
rendered with the node's name, files decoded with their modes and owners, runcmd as cloud-init's script;
and bad or unsupported bootstrap data refused with a message that says what and where."""

from __future__ import annotations

import base64

import pytest
from kubelab.labprovider import cloudconfig
from kubelab.labprovider.cloudconfig import BootstrapDataError

from .cabpk import BASE64, GZIPPED, PLACEHOLDER, SENTINEL_COMMAND, secret, worker_document


def test_a_cabpk_worker_document_becomes_files_and_a_runcmd_script() -> None:
    document = worker_document("kubeadm join --config /run/kubeadm/kubeadm-join-config.yaml", ("hostname x",))
    text = cloudconfig.secret_document(secret("w-1", "ns", document, "c"))
    bootstrap = cloudconfig.parse(text, "hl3h2")
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


def test_list_entries_are_quoted_words_and_a_document_without_the_header_is_not_rendered() -> None:
    text = "#cloud-config\nbootcmd:\n- [echo, 'a b', \"$HOME\"]\nruncmd:\n- echo '{{ v1.local_hostname }}'\n"
    bootstrap = cloudconfig.parse(text, "n1")
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
        ("#cloud-config\nusers:\n- name: alice\n", "does not carry out users"),
        ("#cloud-config\nntp: {enabled: true}\nmounts: [[a, b]]\n", "does not carry out mounts, ntp"),
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
        cloudconfig.parse(document, "n1")
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
