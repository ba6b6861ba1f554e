"""The --capabilities-file loader: a valid file becomes the pure table; every mistake is refused with the
file, the line and the field, before the service starts."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from inplace_extension.capabilities_file import (
    CapabilitiesFileError,
    load_capabilities,
    parse_capabilities,
    parse_file,
)
from inplace_extension.inplace.custom import CustomClaim, HealthCheck
from inplace_extension.runs.role_settings import RoleSettings
from inplace_extension.runs.windows import MaintenanceWindow


@pytest.fixture
def roles(tmp_path: Path) -> Path:
    for role in ("os_image", "motd"):
        (tmp_path / role / "tasks").mkdir(parents=True)
        (tmp_path / role / "tasks" / "main.yml").write_text("---\n[]\n")
    return tmp_path


def capability(roles: Path, name: str = "os_image", role: str = "os_image", claims: str = "") -> str:
    claims = claims or "      - {kind: Metal3Machine, pointer: /image/url}\n"
    return f"  - name: {name}\n    role: {role}\n    roles_path: {roles}\n    claims:\n{claims}"


def refused(text: str) -> str:
    with pytest.raises(CapabilitiesFileError) as info:
        parse_capabilities(text, "caps.yaml")
    message = str(info.value)
    assert message.startswith("capabilities file caps.yaml: ")
    return message


def test_a_valid_file_becomes_the_table_in_file_order(roles: Path) -> None:
    text = (
        "capabilities:\n"
        + capability(roles)
        + capability(roles, "motd", "motd", "      - {kind: KubeadmConfig, pointer: /preKubeadmCommands}\n")
    )
    path = roles / "caps.yaml"
    path.write_text(text)
    table = load_capabilities(path)
    assert table.names == ("os_image", "motd")
    assert table.roles_paths == (str(roles),)
    assert table.capabilities[0].claims == (CustomClaim("Metal3Machine", "/image/url"),)
    assert [c.name for c, _ in table.claims_for("Metal3MachineTemplate", True)] == ["os_image"]
    assert table.claims_for("Metal3MachineTemplate", False) == ()


def test_an_empty_file_declares_nothing() -> None:
    assert not parse_capabilities("", "caps.yaml")


def test_unknown_fields_are_refused_with_their_line(roles: Path) -> None:
    text = "capabilities:\n" + capability(roles) + "    command: bootc switch\n"
    assert (
        "line 7: capabilities[0].command: not a known key; the keys here: name, role, roles_path, claims, "
        "disruption"
    ) in refused(text)


@pytest.mark.parametrize(
    ("claim", "field", "words"),
    [
        ("{kind: Metal3Machine, pointer: image/url}", "pointer", "must be a JSON pointer starting with"),
        ("{kind: Metal3Machine, pointer: /a~2b}", "pointer", "e.g. /image/url"),
        ("{kind: Metal3MachineTemplate, pointer: /image/url}", "kind", "name the machine-level kind"),
        ("{kind: MachineSet, pointer: /version}", "kind", "name the machine-level kind"),
        ("{kind: metal3machine, pointer: /image/url}", "kind", "must be a kind: a capital letter"),
    ],
)
def test_bad_claims_are_refused(roles: Path, claim: str, field: str, words: str) -> None:
    text = "capabilities:\n" + capability(roles, claims=f"      - {claim}\n")
    message = refused(text)
    assert f"line 6: capabilities[0].claims[0].{field}: " in message and words in message


def test_names_are_identifier_like_because_they_prefix_an_ansible_variable(roles: Path) -> None:
    message = refused("capabilities:\n" + capability(roles, name="os-image"))
    assert "line 2: capabilities[0].name: must be a name of lowercase letters, digits and _" in message


def test_a_relative_roles_path_is_refused() -> None:
    text = "capabilities:\n" + capability(Path("roles"))
    assert "line 4: capabilities[0].roles_path: must be an absolute path" in refused(text)


def test_a_missing_role_is_refused_at_load(roles: Path) -> None:
    message = refused("capabilities:\n" + capability(roles, role="bootc"))
    assert f"line 3: capabilities[0].role: no role at {roles / 'bootc'}" in message


@pytest.mark.parametrize(("name", "role"), [("users", "os_image"), ("os_image", "kubernetes_version")])
def test_built_in_names_and_roles_are_refused(roles: Path, name: str, role: str) -> None:
    message = refused("capabilities:\n" + capability(roles, name=name, role=role))
    assert "is a built-in capability" in message or "is the role of a built-in capability" in message


def test_duplicate_names_are_refused(roles: Path) -> None:
    message = refused("capabilities:\n" + capability(roles) + capability(roles))
    assert "line 7: capabilities[1].name: 'os_image' is already declared by capabilities[0]" in message


@pytest.mark.parametrize(
    ("claim", "other"),
    [
        ("{kind: KubeadmConfig, pointer: /files}", "/files, claimed by built-in"),
        ("{kind: KubeadmConfig, pointer: /ntp/servers}", "/ntp, claimed by built-in"),
        ("{kind: Machine, pointer: /version}", "/version, claimed by built-in"),
    ],
)
def test_claims_overlapping_a_built_in_claim_are_refused(roles: Path, claim: str, other: str) -> None:
    message = refused("capabilities:\n" + capability(roles, claims=f"      - {claim}\n"))
    assert "line 6: capabilities[0].claims[0].pointer: " in message and f"overlaps {other}" in message


def test_claims_overlapping_another_custom_claim_are_refused(roles: Path) -> None:
    second = capability(roles, "motd", "motd", "      - {kind: Metal3Machine, pointer: /image}\n")
    message = refused("capabilities:\n" + capability(roles) + second)
    assert (
        "capabilities[1].claims[0].pointer: Metal3Machine /image overlaps /image/url, claimed by os_image"
        in message
    )


def test_the_same_pointer_twice_in_one_capability_is_refused(roles: Path) -> None:
    claims = (
        "      - {kind: Metal3Machine, pointer: /image/url}\n"
        "      - {kind: Metal3Data, pointer: /image/url}\n"
    )
    message = refused("capabilities:\n" + capability(roles, claims=claims))
    assert "capabilities[0].claims[1].pointer: /image/url is already claimed by this capability" in message


def test_not_yaml_and_unreadable_files_are_refused(tmp_path: Path) -> None:
    assert "not valid YAML" in refused("capabilities: [\n")
    with pytest.raises(CapabilitiesFileError, match="cannot read"):
        load_capabilities(tmp_path / "absent.yaml")


def test_a_health_check_gives_a_url_or_a_command_argv() -> None:
    table = parse_capabilities(
        "health_checks:\n"
        "  - name: app\n"
        "    url: http://{address}:8080/ready\n"
        "  - name: etcd\n"
        "    command: [/usr/bin/test, -e, '$(touch /tmp/x)']\n"
        "    timeout_seconds: 2\n"
    )
    assert table.health_checks == (
        HealthCheck("app", "http://{address}:8080/ready"),
        HealthCheck("etcd", timeout_seconds=2.0, command=("/usr/bin/test", "-e", "$(touch /tmp/x)")),
    )
    assert [c.name for c in table.http_checks] == ["app"]
    assert [c.name for c in table.command_checks] == ["etcd"]


@pytest.mark.parametrize(
    ("entry", "where", "words"),
    [
        ("{name: x}", r"health_checks\[0\]", "exactly one of url"),
        ("{name: x, url: 'http://h/', command: [/bin/true]}", r"health_checks\[0\]", "exactly one of url"),
        ("{name: x, command: []}", r"health_checks\[0\]\.command", "must have at least this many items: 1"),
        ("{name: x, command: 'test -e /x'}", r"health_checks\[0\]\.command", "must be a list"),
        ("{name: x, command: [test, 1]}", r"health_checks\[0\]\.command\[1\]", "must be a string"),
        ("{name: x, command: [test, null]}", r"health_checks\[0\]\.command\[1\]", "must be a string"),
        ("{name: x, command: [true]}", r"health_checks\[0\]\.command\[0\]", "must be a string"),
        ("{name: x, command: ['', -e]}", r"health_checks\[0\]", "the program"),
        ("{name: x, command: [/bin/true], status: 200}", r"health_checks\[0\]", "status is for url checks"),
        ("{name: X, command: [/bin/true]}", r"health_checks\[0\]\.name", "must be a name of lowercase"),
    ],
)
def test_bad_health_checks_are_refused(entry: str, where: str, words: str) -> None:
    with pytest.raises(CapabilitiesFileError, match=rf"line 2: {where}: .*{words}"):
        parse_capabilities(f"health_checks:\n  - {entry}\n")


def test_maintenance_windows_become_the_schedule() -> None:
    text = (
        "maintenance_windows:\n"
        "  - name: weeknights\n"
        '    cron: "0 22 * * 1-5"\n'
        "    duration: 4h\n"
        "    time_zone: Europe/Berlin\n"
        "    labels: {cluster.x-k8s.io/cluster-name: prod}\n"
        "  - {name: sundays, cron: '30 6 * * 0', duration: 1h30m}\n"
    )
    windows = parse_file(text, "caps.yaml").windows.windows
    assert windows == (
        MaintenanceWindow(
            "weeknights",
            "0 22 * * 1-5",
            4 * 3600,
            "Europe/Berlin",
            (("cluster.x-k8s.io/cluster-name", "prod"),),
        ),
        MaintenanceWindow("sundays", "30 6 * * 0", 5400, "UTC", ()),
    )
    assert not parse_file("", "caps.yaml").windows.windows


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ("cron: '0 25 * * *'", "line 3: maintenance_windows[0].cron: not a 5-field cron"),
        ("cron: '0 22 * * * 0'", "line 3: maintenance_windows[0].cron: not a 5-field cron"),
        (
            "duration: 4 hours",
            "line 3: maintenance_windows[0].duration: give hours and/or minutes",
        ),
        ("duration: 0m", "line 3: maintenance_windows[0].duration: must be longer than 0"),
        ("duration: 169h", "line 3: maintenance_windows[0].duration: must be longer than 0"),
        (
            "time_zone: Mars/Olympus",
            "line 3: maintenance_windows[0].time_zone: not a known IANA",
        ),
        (
            "labels: {'bad key!': x}",
            "line 3: maintenance_windows[0].labels.bad key!.[key]: must be a Kubernetes annotation or label",
        ),
        ("every: day", "line 3: maintenance_windows[0].every: not a known key; the keys here: name, cron"),
    ],
)
def test_bad_windows_are_refused_with_line_and_field(entry: str, problem: str) -> None:
    fields = {"name": "w", "cron": "'0 22 * * *'", "duration": "1h"}
    key = entry.split(":", 1)[0]
    fields.pop(key, None)
    text = "maintenance_windows:\n  - name: w\n    " + entry + "\n"
    text += "".join(f"    {k}: {v}\n" for k, v in fields.items() if k != "name")
    assert problem in refused(text)


def test_window_names_are_unique() -> None:
    text = "maintenance_windows:\n" + "  - {name: w, cron: '0 22 * * *', duration: 1h}\n" * 2
    assert "line 2: maintenance_windows: window names must be unique" in refused(text)


def test_role_settings_become_the_roles_ansible_variables() -> None:
    text = (
        "role_settings:\n"
        "  kubernetes_version:\n"
        "    package_source: binary\n"
        "    binary_base_url: https://mirror.example.internal/kubernetes/release\n"
        "    health_delay_seconds: 5\n"
        "    kubeadm_upgrade_args:\n"
        "      - --ignore-preflight-errors=SystemVerification\n"
        "      - --certificate-renewal=false\n"
        "  users: {default_lock_password: false}\n"
    )
    assert parse_file(text, "caps.yaml").role_vars == {
        "kubernetes_version_package_source": "binary",
        "kubernetes_version_binary_base_url": "https://mirror.example.internal/kubernetes/release",
        "kubernetes_version_health_delay_seconds": 5,
        "kubernetes_version_kubeadm_upgrade_args": [
            "--ignore-preflight-errors=SystemVerification",
            "--certificate-renewal=false",
        ],
        "users_default_lock_password": False,
    }
    assert parse_file("", "caps.yaml").role_vars == {}


@pytest.mark.parametrize(
    ("settings", "problem"),
    [
        (
            "kubernetes_version: {package_source: yum}",
            "line 2: role_settings.kubernetes_version.package_source: ",
        ),
        (
            'kubernetes_version: {binary_base_url: \'https://m/{{ lookup("pipe", "id") }}\'}',
            "line 2: role_settings.kubernetes_version.binary_base_url: must be an http:// or https:// URL "
            "without a trailing slash",
        ),
        (
            "kubernetes_version: {binary_base_url: 'https://mirror/release/'}",
            "e.g. https://mirror.example.com/k8s",
        ),
        (
            "kubernetes_version: {kubeadm_upgrade_args: ['--patches={{ x }}']}",
            "line 2: role_settings.kubernetes_version.kubeadm_upgrade_args[0]: must be a kubeadm flag",
        ),
        (
            "kubernetes_version: {kubeadm_upgrade_args: [-v]}",
            "kubeadm_upgrade_args[0]: must be a kubeadm flag, --name or --name=value",
        ),
        (
            "kubernetes_version: {health_retries: 0}",
            "role_settings.kubernetes_version.health_retries: must be at least 1",
        ),
        (
            "kubernetes_version: {kubeadm_arg_pattern: '.*'}",
            "kubeadm_arg_pattern: not a known key; the keys here: package_source",
        ),
        (
            "ntp: {ntp_server_pattern: '.*'}",
            "line 2: role_settings.ntp: not a known key; the keys here: kubernetes",
        ),
    ],
)
def test_bad_role_settings_are_refused_with_line_and_field(settings: str, problem: str) -> None:
    assert problem in refused(f"role_settings:\n  {settings}\n")


def test_every_role_setting_is_a_default_of_its_role_with_the_same_type() -> None:
    """A setting that no role reads would be accepted and silently do nothing."""
    roles = Path(__file__).resolve().parents[1] / "playbooks" / "roles"
    for role, field in RoleSettings.model_fields.items():
        defaults = yaml.safe_load((roles / role / "defaults" / "main.yml").read_text())
        assert field.annotation is not None
        for name in field.annotation.model_fields:
            variable = f"{role}_{name}"
            assert variable in defaults, f"{variable} is not a default of role {role}"
            default = defaults[variable]
            accepted = RoleSettings.model_validate({role: {name: default}}).extra_vars()
            assert accepted == {variable: default}, f"{variable}: its default is not a valid setting"


CEPH_CHECK = (
    "health_checks:\n"
    "  - name: ceph\n"
    "    kubernetes:\n"
    "      api_version: ceph.rook.io/v1\n"
    "      kind: CephCluster\n"
    "      namespace: rook-ceph\n"
    "      name: ceph\n"
    '      expression: object.status.health == "HEALTH_OK"\n'
    "  - name: db\n"
    "    kubernetes:\n"
    "      api_version: apps/v1\n"
    "      kind: StatefulSet\n"
    "      namespace: db\n"
    "      selector: {app: db}\n"
    "      expression: object.status.readyReplicas == object.spec.replicas\n"
)


def test_a_kubernetes_health_check_names_its_objects_and_compiles_its_expression() -> None:
    table = parse_capabilities(CEPH_CHECK)
    ceph, db = (check.kubernetes for check in table.object_checks)
    assert ceph is not None and db is not None
    assert (ceph.api_version, ceph.kind, ceph.namespace, ceph.name, ceph.selector) == (
        "ceph.rook.io/v1",
        "CephCluster",
        "rook-ceph",
        "ceph",
        (),
    )
    assert ceph.target == "CephCluster rook-ceph/ceph"
    assert ceph.expression.evaluate({"status": {"health": "HEALTH_OK"}}).holds
    assert (db.name, db.selector, db.target) == (None, (("app", "db"),), "StatefulSet with app=db in db")
    assert table.http_checks == () and table.command_checks == ()


@pytest.mark.parametrize(
    ("body", "line", "where", "words"),
    [
        (
            'expression: object.status.health = "HEALTH_OK"',
            8,
            r"\.expression",
            "not a CEL expression: syntax error at column 22",
        ),
        ("expression: obj.status.ready", 8, r"\.expression", "unknown name 'obj'"),
        ("expression: object.ready\n      selector: {app: x}", 4, "", "exactly one of name"),
        (
            "expression: object.ready\n      api_version: ceph/v1/x",
            8,
            r"\.api_version",
            "must be an apiVersion",
        ),
    ],
)
def test_bad_kubernetes_checks_stop_the_start_with_line_and_field(
    body: str, line: int, where: str, words: str
) -> None:
    text = (
        "health_checks:\n"
        "  - name: ceph\n"
        "    kubernetes:\n"
        "      kind: CephCluster\n"
        "      namespace: rook-ceph\n"
        "      name: ceph\n"
        + ("" if "api_version" in body else "      api_version: ceph.rook.io/v1\n")
        + f"      {body}\n"
    )
    with pytest.raises(
        CapabilitiesFileError, match=rf"line {line}: health_checks\[0\]\.kubernetes{where}: .*{words}"
    ):
        parse_capabilities(text)


def test_a_kubernetes_check_may_give_a_timeout_for_the_wait_before_an_update_starts() -> None:
    """docs/operator-controls.md: optional, no default (an update waits as long as it takes), in the
    maintenance windows' syntax plus seconds (a timeout may be short)."""
    ceph, db = (check.kubernetes for check in parse_capabilities(CEPH_CHECK).object_checks)
    assert ceph is not None and db is not None
    assert (ceph.start_timeout_seconds, db.start_timeout_seconds) == (None, None)
    for spelled, seconds in [("2h", 7200), ("1h30m", 5400), ("90s", 90), ("2m30s", 150), ("168h", 604800)]:
        text = CEPH_CHECK.replace("      name: ceph\n", f"      name: ceph\n      timeout: {spelled}\n")
        ceph = parse_capabilities(text).object_checks[0].kubernetes
        assert ceph is not None and ceph.start_timeout_seconds == seconds, spelled


@pytest.mark.parametrize(
    ("timeout", "words"),
    [
        ("2 hours", "give hours, minutes and/or seconds"),
        ("'30'", "give hours, minutes and/or seconds"),
        ("0s", "must be longer than 0"),
        ("169h", "at most 7 days"),
        ("1d", "give hours, minutes and/or seconds"),
        ("120", "must be a string"),
    ],
)
def test_a_bad_timeout_stops_the_start_with_line_and_field(timeout: str, words: str) -> None:
    text = CEPH_CHECK.replace("      name: ceph\n", f"      name: ceph\n      timeout: {timeout}\n")
    assert "line 8: health_checks[0].kubernetes.timeout: " in refused(text)
    assert words in refused(text)


def test_a_window_duration_stays_in_hours_and_minutes() -> None:
    text = "maintenance_windows:\n  - {name: w, cron: '0 22 * * *', duration: 90s}\n"
    assert "line 2: maintenance_windows[0].duration: give hours and/or minutes" in refused(text)


def test_a_check_is_one_of_url_command_or_kubernetes() -> None:
    text = CEPH_CHECK.replace("  - name: ceph\n", "  - name: ceph\n    url: http://h/\n", 1)
    with pytest.raises(CapabilitiesFileError, match=r"line 2: health_checks\[0\]: .*exactly one of url"):
        parse_capabilities(text)
