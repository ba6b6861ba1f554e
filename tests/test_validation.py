"""The one wording of validation errors (inplace_extension/validation.py): every kind of mistake in the
capabilities file, the inventory and a MachineClass's desired state reads as words, never as a raw
regular expression, and an unknown key gets the valid keys with a "did you mean"."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from inplace_extension.capabilities_file import CapabilitiesFileError, parse_file
from inplace_extension.mcm.desired import DesiredStateError, parse_spec
from inplace_extension.runs.inventory import InventoryError, parse_inventory
from inplace_extension.schemas import MODELS
from inplace_extension.validation import meaning_of, unknown_key

# anything that looks like a regular expression leaking into a message
REGEX_SIGNS = re.compile(r"\^\[|\]\+|\]\*|\$'|\\s|\\x|\{0,")


def refused_capabilities(text: str) -> str:
    with pytest.raises(CapabilitiesFileError) as caught:
        parse_file(text, "caps.yaml")
    message = str(caught.value)
    assert not REGEX_SIGNS.search(message), message
    return message


def refused_inventory(text: str) -> str:
    with pytest.raises(InventoryError) as caught:
        parse_inventory(text, "inv.yaml")
    message = str(caught.value)
    assert not REGEX_SIGNS.search(message), message
    return message


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # a misspelt role: the roles, and the close one
        (
            "role_settings:\n  kubernetes_versoin: {package_source: apt}\n",
            'line 2: role_settings.kubernetes_versoin: not a known key (did you mean "kubernetes_version"?); '
            "the keys here: kubernetes_version, kubelet_args, kubelet_credentials, users",
        ),
        # a misspelt setting of a role
        (
            "role_settings:\n  kubernetes_version: {binary_base_ur: 'https://mirror.example.com'}\n",
            "role_settings.kubernetes_version.binary_base_ur: "
            'not a known key (did you mean "binary_base_url"?)',
        ),
        # a misspelt top-level key
        (
            "maintenance_window: []\n",
            'line 1: maintenance_window: not a known key (did you mean "maintenance_windows"?); '
            "the keys here: "
            "os_update, kubelet_credentials, capabilities, health_checks, maintenance_windows, role_settings",
        ),
        # nothing close: the keys, no guess
        ("role_settings:\n  zzz: {}\n", "role_settings.zzz: not a known key; the keys here: kubernetes_"),
        # patterns in words, with an example
        (
            "role_settings:\n  kubernetes_version: {binary_base_url: 'https://mirror.example.com/release/'}\n",
            "line 2: role_settings.kubernetes_version.binary_base_url: must be an http:// or https:// URL "
            "without a trailing slash, blanks, quotes, backslashes or template characters ({ } %), "
            "e.g. https://mirror.example.com/k8s",
        ),
        (
            "role_settings:\n  kubernetes_version: {kubeadm_upgrade_args: [ignore-preflight-errors=all]}\n",
            "role_settings.kubernetes_version.kubeadm_upgrade_args[0]: must be a kubeadm flag, --name or "
            "--name=value",
        ),
        # a choice, a type, a range, a validator's own words
        (
            "role_settings:\n  kubernetes_version: {package_source: yum}\n",
            "role_settings.kubernetes_version.package_source: must be one of 'apt' or 'binary'",
        ),
        ("maintenance_windows: {}\n", "line 1: maintenance_windows: must be a list"),
        (
            "role_settings:\n  kubelet_args: {health_timeout_seconds: many}\n",
            "role_settings.kubelet_args.health_timeout_seconds: must be an integer",
        ),
        (
            "maintenance_windows:\n  - {name: w, cron: '0 22 * * *', duration: 1d}\n",
            "maintenance_windows[0].duration: give hours and/or minutes",
        ),
        ("maintenance_windows:\n  - {name: w, duration: 1h}\n", "maintenance_windows[0].cron: missing: this"),
    ],
)
def test_each_kind_of_mistake_in_the_capabilities_file_reads_as_words(text: str, expected: str) -> None:
    assert expected in refused_capabilities(text)


def test_an_inventory_key_misspelt_gets_the_valid_ones() -> None:
    message = refused_inventory("hosts:\n  - match: {name: m}\n    adress: 10.0.0.1\n")
    expected = 'line 3: hosts[0].adress: not a known key (did you mean "address"?); the keys here: port, user'
    assert expected in message
    message = refused_inventory("defaults: {usr: root}\n")
    assert 'defaults.usr: not a known key (did you mean "user"?)' in message


def test_a_machine_class_desired_state_gets_the_valid_keys_by_their_yaml_names() -> None:
    machine_class = {
        "metadata": {"name": "pool"},
        "providerSpec": {"inPlaceUpdate": {"kubernetesVersio": "v1.36.3"}},
    }
    with pytest.raises(DesiredStateError) as caught:
        parse_spec(machine_class)
    assert 'kubernetesVersio: not a known key (did you mean "kubernetesVersion"?)' in str(caught.value)


def test_unknown_key_without_any_valid_one_says_only_that() -> None:
    assert unknown_key("x", []) == "not a known key"


def _patterns(schema: Any) -> Iterator[str]:
    if isinstance(schema, dict):
        for key, value in schema.items():
            if key == "pattern" and isinstance(value, str):
                yield value
            else:
                yield from _patterns(value)
    elif isinstance(schema, list):
        for item in schema:
            yield from _patterns(item)


def test_every_pattern_of_every_model_is_described_in_words() -> None:
    """A pattern without words would be refused with only "does not have the expected form"."""
    found = {
        pattern
        for model, mode in MODELS.values()
        for pattern in _patterns(model.model_json_schema(by_alias=True, mode=mode))
    }
    assert found, "the models hold patterns: the walk is broken"
    assert sorted(pattern for pattern in found if meaning_of(pattern) is None) == []
