"""The ansible-runner adapter without hosts: files it writes, ssh options, and refusing to start."""

from __future__ import annotations

import dataclasses
import json
import shutil
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from inplace_extension.inplace.plan import step_fingerprints
from inplace_extension.plays import runner, ssh
from inplace_extension.runs.model import CommandCheck
from inplace_extension.runs.resolve import HostTarget

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJAm/+qD5i6Qm8kDm+Qr9ygOJL1jDRtSlh6jlxmhLn0T"
PLAYBOOK = Path(__file__).resolve().parents[2] / "playbooks" / "update_machine.yml"


def target(insecure: bool = False) -> HostTarget:
    return HostTarget(
        "10.9.0.5",
        2222,
        "ops",
        Path("/keys/id"),
        True,
        () if insecure else (KEY,),
        insecure,
        None,
        "inventory",
    )


def host_run(tmp_path: Path, insecure: bool = False) -> runner.HostRun:
    attempt = tmp_path / "ns.m1.abc" / "attempt-0001"
    attempt.mkdir(parents=True)
    inputs: dict[str, dict[str, Any]] = {
        "ntp": {"ntp_servers": ["{{ lookup('pipe', 'id') }}"]},
        "users": {"users_users": []},
    }
    return runner.HostRun("ns.m1.abc", "ns.m1.abc", "ab" * 32, ("ntp",), inputs, target(insecure), attempt)


def test_host_key_is_pinned_under_an_alias(tmp_path: Path) -> None:
    run = host_run(tmp_path)
    host = ssh.host_vars(run.target, run.attempt_dir)
    assert (host["ansible_host"], host["ansible_port"], host["ansible_user"]) == ("10.9.0.5", 2222, "ops")
    assert host["ansible_host_key_checking"] is True
    args = host["ansible_ssh_common_args"]
    assert "StrictHostKeyChecking=yes" in args and "GlobalKnownHostsFile=/dev/null" in args
    assert f"HostKeyAlias={ssh.HOST_KEY_ALIAS}" in args
    assert (run.attempt_dir / "known_hosts").read_text() == f"{ssh.HOST_KEY_ALIAS} {KEY}\n"
    insecure = ssh.host_vars(target(insecure=True), run.attempt_dir)
    assert insecure["ansible_host_key_checking"] is False
    assert "StrictHostKeyChecking=no" in insecure["ansible_ssh_common_args"]


def test_control_path_dir_stays_short(tmp_path: Path) -> None:
    assert ssh.control_path_dir(Path("/var/lib/x")) == Path("/var/lib/x/cp")
    long_dir = tmp_path / ("d" * 80)
    short = ssh.control_path_dir(long_dir)
    assert len(str(short)) <= ssh.MAX_CONTROL_DIR_LEN and short == ssh.control_path_dir(long_dir)
    short.mkdir()
    ssh.close_control_masters(long_dir)  # nothing to close; the empty fallback dir goes away
    assert not short.exists()


def test_inputs_file_holds_only_the_run_capabilities_and_start_refusals_are_translated(
    tmp_path: Path,
) -> None:
    run = host_run(tmp_path)
    spec = runner.BatchSpec(
        ident="batch-x",
        batch_dir=tmp_path / "missing-batch-dir",  # ansible-runner insists that it exists
        hosts=(run,),
        playbook=PLAYBOOK,
        ansible_cfg=None,
        state_dir=tmp_path,
        wrapper=runner.install_wrapper(tmp_path),
    )
    try:
        with pytest.raises(runner.RunStartError, match="could not start"):
            runner.start(spec, lambda host, role, task: None)
    finally:
        ssh.close_control_masters(tmp_path)  # removes the control path dir start() made
    inputs_file = run.attempt_dir / "inputs.json"
    assert json.loads(inputs_file.read_text()) == {"ntp": {"ntp_servers": ["{{ lookup('pipe', 'id') }}"]}}
    assert inputs_file.stat().st_mode & 0o777 == 0o600


def test_user_defined_steps_become_role_parameters_and_their_roles_path_is_searched(tmp_path: Path) -> None:
    run = host_run(tmp_path)
    run = runner.HostRun(
        run.ident,
        run.host_name,
        run.fingerprint,
        ("ntp", "os_image"),
        {**run.inputs, "os_image": {"os_image_values": {"/image/url": "x"}}},
        run.target,
        run.attempt_dir,
        roles={"os_image": "bootc_image"},
    )
    params = runner.run_parameters(run, run.attempt_dir / "inputs.json")
    assert params["update_machine_capabilities"] == ["ntp", "os_image"]
    # one fingerprint per step, as the plan computes them: the host's stamp keeps them
    assert params["update_machine_step_fingerprints"] == step_fingerprints(
        {"ntp": run.inputs["ntp"], "os_image": run.inputs["os_image"]}
    )
    assert params["update_machine_custom"] == [{"capability": "os_image", "role": "bootc_image"}]
    assert "x" not in json.dumps(params)  # values travel in the inputs file only
    spec = runner.BatchSpec(
        "batch-x",
        tmp_path,
        (run,),
        PLAYBOOK,
        None,
        tmp_path,
        tmp_path / "wrapper",
        roles_paths=(Path("/srv/roles"), Path("/opt/more")),
    )
    env = runner._envvars(spec)
    assert env["ANSIBLE_ROLES_PATH"] == f"{PLAYBOOK.parent / 'roles'}:/srv/roles:/opt/more"
    plain = runner._envvars(runner.BatchSpec("b", tmp_path, (run,), PLAYBOOK, None, tmp_path, tmp_path / "w"))
    assert "ANSIBLE_ROLES_PATH" not in plain  # ansible.cfg's roles_path stays in charge
    ssh.close_control_masters(tmp_path)


def test_control_path_sockets_fit_at_the_limit_and_beyond() -> None:
    # ssh binds "<dir>/<40-char %C hash>.XXXXXXXXXXXXXXXX" first: it must fit for a runs dir whose cp
    # directory is exactly at the limit (kept) and for one a character longer (moved to the fallback)
    base = Path(tempfile.mkdtemp(prefix="cp", dir="/tmp"))
    try:
        for extra in (0, 1):
            state_dir = base / ("s" * (ssh.MAX_CONTROL_DIR_LEN - len(str(base)) - 4 + extra))
            cp_dir = ssh.control_path_dir(state_dir)
            assert (cp_dir == state_dir / "cp") is (extra == 0)
            cp_dir.mkdir(parents=True, exist_ok=True)
            with socket.socket(socket.AF_UNIX) as sock:
                sock.bind(str(cp_dir / ("0" * 40 + ".XXXXXXXXXXXXXXXX")))
            if extra:
                shutil.rmtree(cp_dir)  # the fallback lives outside ``base``
    finally:
        shutil.rmtree(base)


def test_role_settings_reach_a_real_play_as_extra_vars_over_the_role_defaults(tmp_path: Path) -> None:
    """A real ansible-playbook (local connection): the role default is replaced by the setting."""
    playbooks = tmp_path / "playbooks"
    (playbooks / "roles" / "probe" / "defaults").mkdir(parents=True)
    (playbooks / "roles" / "probe" / "tasks").mkdir(parents=True)
    (playbooks / "roles" / "probe" / "defaults" / "main.yml").write_text(
        "kubernetes_version_binary_base_url: https://dl.k8s.io/release\n"
        "kubernetes_version_health_retries: 60\n"
    )
    out = tmp_path / "seen.json"
    (playbooks / "roles" / "probe" / "tasks" / "main.yml").write_text(
        "- name: Write what the role sees\n"
        "  ansible.builtin.copy:\n"
        f"    dest: {out}\n"
        '    content: \'{{ {"url": kubernetes_version_binary_base_url,'
        ' "retries": kubernetes_version_health_retries} | to_json }}\'\n'
        "    mode: '0600'\n"
    )
    (playbooks / "update_machine.yml").write_text(
        "- hosts: all\n  connection: local\n  gather_facts: false\n  roles: [probe]\n"
        f"  vars: {{ansible_python_interpreter: {sys.executable}}}\n"
    )
    run = host_run(tmp_path)
    batch_dir = tmp_path / "batch"
    batch_dir.mkdir()
    role_vars = {"kubernetes_version_binary_base_url": "https://mirror.example.internal/k8s"}
    playbook, wrapper = playbooks / "update_machine.yml", runner.install_wrapper(tmp_path)
    spec = runner.BatchSpec(
        "batch-x", batch_dir, (run,), playbook, None, tmp_path, wrapper, role_vars=role_vars
    )
    try:
        status = runner.start(spec, lambda host, role, task: None).wait()
    finally:
        ssh.close_control_masters(tmp_path)
    assert status == "successful", (batch_dir / "artifacts" / "batch-x" / "stdout").read_text()
    assert json.loads(out.read_text()) == {"url": "https://mirror.example.internal/k8s", "retries": 60}
    assert (batch_dir / "role_settings.json").stat().st_mode & 0o777 == 0o600


def test_the_lock_task_is_left_out_when_every_machines_first_step_takes_the_lock(tmp_path: Path) -> None:
    """update_machine.yml's update_machine_lock_rides_on for the service's runs: the lock token given, the
    first step one whose module can take the lock, no drain point."""
    plain = host_run(tmp_path)  # ntp first, but no lock token: the lock task takes it
    with_token = dataclasses.replace(plain, lock_token="f" * 32)
    drained = dataclasses.replace(with_token, drain_before="ntp", drain_wait_seconds=60)
    users_first = dataclasses.replace(with_token, capabilities=("users", "ntp"))

    def leaves_out(*runs: runner.HostRun) -> bool:
        spec = runner.BatchSpec("b", tmp_path, runs, PLAYBOOK, None, tmp_path, tmp_path / "w")
        return runner.LOCK_TAG in runner.skip_tags(spec)

    assert leaves_out(with_token)
    assert not leaves_out(plain) and not leaves_out(drained) and not leaves_out(users_first)
    assert not leaves_out(with_token, users_first)  # one Machine of the batch needs the lock task
    # the riders named here are the ones the play names
    play = PLAYBOOK.read_text()
    assert f"update_machine_lock_riders: [{', '.join(sorted(runner.LOCK_RIDERS, key=play.index))}]" in play


def test_the_play_leaves_out_by_tag_only_what_python_checked_and_what_no_machine_of_the_batch_has(
    tmp_path: Path,
) -> None:
    """Tasks filtered out by --skip-tags are never queued (a `when` still costs a worker per host): the
    re-checks, and each part of the play no Machine of the batch has; a part one Machine has stays."""
    one = host_run(tmp_path)  # ntp only, no drain point, no user-defined step
    tagged = runner.skip_tags(
        runner.BatchSpec("b", tmp_path, (one,), PLAYBOOK, None, tmp_path, tmp_path / "w")
    )
    assert tagged == [
        runner.RECHECK_TAG,
        "update_machine_step_users",
        "update_machine_step_kubeadm_files",
        "update_machine_step_kubelet_args",
        "update_machine_step_kubernetes_version",
        runner.DRAIN_TAG,
        runner.CUSTOM_TAG,
        runner.HEALTH_TAG,
        runner.JOINT_TAG,
    ]
    other_dir = tmp_path / "ns.m2.abc" / "attempt-0001"
    other_dir.mkdir(parents=True)
    other = runner.HostRun(
        "ns.m2.abc",
        "ns.m2.abc",
        "cd" * 32,
        ("users", "os_image"),
        {"users": {"users_users": []}, "os_image": {"os_image_values": {}}},
        target(),
        other_dir,
        roles={"os_image": "bootc_image"},
        drain_before="os_image",
        drain_wait_seconds=60,
    )
    check = CommandCheck("app", ("/bin/true",), 5)
    both = runner.BatchSpec(
        "b", tmp_path, (one, other), PLAYBOOK, None, tmp_path, tmp_path / "w", host_checks=(check,)
    )
    assert runner.skip_tags(both) == [
        runner.RECHECK_TAG,
        "update_machine_step_kubeadm_files",
        "update_machine_step_kubelet_args",
        "update_machine_step_kubernetes_version",
        runner.JOINT_TAG,
    ]
    # every tag named is one update_machine.yml carries: a typo would leave out nothing
    play = PLAYBOOK.read_text() + "".join(
        (PLAYBOOK.parent / "roles" / role / "tasks" / "main.yml").read_text()
        for role in ("kubeadm_files", "kubelet_args")
    )
    for tag in (runner.RECHECK_TAG, runner.DRAIN_TAG, runner.CUSTOM_TAG, runner.HEALTH_TAG, runner.LOCK_TAG):
        assert f"tags: [{tag}]" in play or f"tags: [always, {tag}]" in play, tag
    for cap in ("users", "ntp", "kubeadm_files", "kubelet_args", "kubernetes_version"):
        # the built-in step's include carries a tag of ours: a user's role may tag its tasks with a bare name
        assert f"tags: [{cap}, {runner.STEP_TAG.format(cap)}" in play, cap


def test_kubeadm_files_and_kubelet_args_are_one_execution_or_their_roles_by_tag(tmp_path: Path) -> None:
    """update_machine.yml's update_machine_joint for the service's runs: a Machine with both steps and no
    drain point between them has them done in one module execution; the batch leaves out by tag the
    roles when every Machine with either takes that execution, the execution when none does."""
    joint = dataclasses.replace(host_run(tmp_path), capabilities=("kubeadm_files", "kubelet_args"))
    files_only = dataclasses.replace(joint, capabilities=("kubeadm_files",))
    drained = dataclasses.replace(joint, drain_before="kubelet_args", drain_wait_seconds=60)
    drained_first = dataclasses.replace(joint, drain_before="kubeadm_files", drain_wait_seconds=60)

    def left_out(*runs: runner.HostRun) -> set[str]:
        spec = runner.BatchSpec("b", tmp_path, runs, PLAYBOOK, None, tmp_path, tmp_path / "w")
        return {runner.JOINT_TAG, runner.APART_TAG} & set(runner.skip_tags(spec))

    assert left_out(joint) == {runner.APART_TAG} == left_out(drained_first)
    assert left_out(files_only) == {runner.JOINT_TAG} == left_out(drained)
    assert left_out(joint, files_only) == set()  # each Machine's play takes its own way
    assert left_out(joint, host_run(tmp_path / "ntp")) == {runner.APART_TAG}  # ntp has neither
    play = PLAYBOOK.read_text()
    assert f"tags: [kubeadm_files, kubelet_args, {runner.JOINT_TAG}]" in play
    assert f"tags: [kubelet_args, update_machine_step_kubelet_args, {runner.APART_TAG}]" in play
