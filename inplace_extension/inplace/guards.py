"""Claim guards: why a changed field is NOT carried out in place, or None when its capability can do it.

A guard sees one changed field (current and desired values at the claim pointer, both whole specs) and
answers with a deterministic reason that names rules, entry indexes and keys, never values (claim only
what a role really carries out; when in doubt, decline: a rollout is always correct).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from inplace_extension.inplace.entries import (
    TEMPLATE_PROBLEM,
    EntryInvalid,
    EntrySkipped,
    describe_key,
    effective_kubelet_args,
    entries_of,
    holds_template,
    kubelet_arg_change_problem,
    parse_kubelet_arg,
    parse_ntp,
    parse_user,
)
from inplace_extension.inplace.files import parse_file
from inplace_extension.inplace.pointers import MISSING, is_object
from inplace_extension.inplace.versions import upgrade_problem


@dataclass(frozen=True)
class Change:
    """One claimed pointer whose value differs between current and desired (values may be ``MISSING``)."""

    pointer: str
    current: Any
    desired: Any
    current_spec: Mapping[str, Any]
    desired_spec: Mapping[str, Any]
    version_upgrade_claimed: bool  # did kubernetes_version claim this request's Machine version change?


Guard = Callable[[Change], str | None]


def kubernetes_upgrade(change: Change) -> str | None:
    return upgrade_problem(change.current, change.desired)


def with_version_upgrade(change: Change) -> str | None:
    # kubeadm upgrade node re-applies these cluster settings; on their own nothing would apply them.
    if change.version_upgrade_claimed:
        return None
    return "it changes in place only together with an in-place Kubernetes version upgrade"


def kubeadm_files(change: Change) -> str | None:
    problem = _list_problem(
        change.current, change.desired, "path", parse_file, "files written earlier are not deleted"
    )
    if problem is not None:
        return problem
    current_by_path = {_identity(entry, "path"): entry for entry in entries_of(change.current)}
    for index, entry in enumerate(entries_of(change.desired)):
        before = current_by_path.get(_identity(entry, "path"))
        appends = _appends(before) or (before is not None and _appends(entry))
        if appends and _canonical(before) != _canonical(entry):
            # What bootstrap appended (or wrote whole) has no marker the role could find and replace.
            return f"entry {index} changes an append entry of an existing file, which is not undone in place"
    return None


def _appends(entry: Any) -> bool:
    return is_object(entry) and entry.get("append") is True


def users(change: Change) -> str | None:
    problem = _list_problem(change.current, change.desired, "name", parse_user, "users are not deleted")
    if problem is not None:
        return problem
    seen: set[str | None] = set()
    for index, entry in enumerate(entries_of(change.desired)):
        if _identity(entry, "name") in seen:
            return f"entry {index} repeats an earlier user"  # the users role refuses duplicates
        seen.add(_identity(entry, "name"))
    current_by_name = {_identity(entry, "name"): entry for entry in entries_of(change.current)}
    for index, entry in enumerate(entries_of(change.desired)):
        before = current_by_name.get(_identity(entry, "name"))
        if is_object(before) and is_object(entry):
            problem = _user_change_problem(before, entry)
            if problem is not None:
                return f"entry {index} {problem}"
    return None


def _user_change_problem(before: Mapping[str, Any], after: Mapping[str, Any]) -> str | None:
    """What the users role cannot undo for an existing user (it converges towards more, not less)."""
    dropped = sorted(set(before) - set(after))
    if dropped:
        return f"drops field {describe_key(dropped[0])}, which is not undone in place"
    if _groups(before.get("groups")) - _groups(after.get("groups")):
        return "leaves a group; group memberships are only added in place"
    if before.get("sudo") and before.get("sudo") != after.get("sudo"):
        # sudo rules add up: the one written at bootstrap would stay in force beside the new one.
        return "changes its sudo rule; the earlier rule would stay in force"
    return None


def _groups(value: Any) -> set[str]:
    return {group.strip() for group in value.split(",") if group.strip()} if isinstance(value, str) else set()


def kubelet_args(change: Change) -> str | None:
    # Both claimed pointers are judged on the list the node actually uses (join, else init): the same
    # choice the plan makes, so a claim is exactly what the role will write.
    _, current = effective_kubelet_args(change.current_spec)
    _, desired = effective_kubelet_args(change.desired_spec)
    problem = _list_problem(
        current, desired, "name", parse_kubelet_arg, "arguments set earlier are not removed"
    )
    if problem is not None:
        return problem
    before: dict[str, str] = {}
    for entry in reversed(entries_of(current)):  # the first occurrence of a name wins the lookup
        name, value = _identity(entry, "name"), _identity(entry, "value") or ""
        if name is not None:
            before[name] = value
    for index, entry in enumerate(entries_of(desired)):  # all parsed above, so well formed
        name, value = _identity(entry, "name"), _identity(entry, "value") or ""
        if name in before:
            problem = kubelet_arg_change_problem(name, before[name], value)
            if problem is not None:
                return f"entry {index} {problem}"
    return None


def ntp(change: Change) -> str | None:
    if change.desired is MISSING:
        return "removing the ntp settings is not carried out in place (the earlier time settings are unknown)"
    if holds_template(change.desired):
        return f"the desired value {TEMPLATE_PROBLEM}"
    try:
        parse_ntp(change.desired)
    except EntrySkipped as exc:
        return f"the desired value {exc}"
    except EntryInvalid as exc:
        return _invalid("the desired value", exc)
    return None


def _list_problem(
    current: Any, desired: Any, key: str, parse: Callable[[Any], object], removal_rule: str
) -> str | None:
    """Lists of entries: nothing removed, and every new or changed entry carried out by the role."""
    try:
        current_entries = entries_of(current)
    except EntryInvalid:
        return "the current value is not a list"
    try:
        desired_entries = entries_of(desired)
    except EntryInvalid:
        return "the desired value is not a list"
    desired_keys = {_identity(entry, key) for entry in desired_entries}
    for index, entry in enumerate(current_entries):
        if _identity(entry, key) not in desired_keys:
            return f"entry {index} of the current list is removed, and {removal_rule} in place"
    unchanged = {_canonical(entry) for entry in current_entries}
    # identities of templated entries (Metal3: node-labels=metal3.io/uuid={{ ds.meta_data.uuid }}) that
    # the desired list no longer holds as they are: a new value for them is a changed template
    retemplated = {
        _identity(entry, key)
        for entry in current_entries
        if holds_template(entry) and _identity(entry, key) is not None
    }
    for index, entry in enumerate(desired_entries):
        if holds_template(entry) or _identity(entry, key) in retemplated:
            if _canonical(entry) in unchanged:
                continue  # as rendered at bootstrap; the UpdateMachine plan leaves it out of the role inputs
            return f"entry {index} {TEMPLATE_PROBLEM}"
        try:
            parse(entry)
        except EntrySkipped as exc:
            # An unchanged entry the role leaves alone stays as bootstrap wrote it: only new ones block.
            if _canonical(entry) not in unchanged:
                return f"entry {index} {exc}"
        except EntryInvalid as exc:
            # Invalid even when unchanged: the UpdateMachine plan would refuse it.
            return _invalid(f"entry {index}", exc)
    return None


def _identity(entry: Any, key: str) -> str | None:
    """A string field of an entry (a file's path, a user's or an argument's name), or None."""
    value = entry.get(key) if is_object(entry) else None
    return value if isinstance(value, str) else None


def _canonical(entry: Any) -> str:
    return json.dumps(entry, sort_keys=True, separators=(",", ":"))


def _invalid(subject: str, exc: EntryInvalid) -> str:
    return f"{subject} {exc.where} {exc.problem}" if exc.where else f"{subject} {exc.problem}"
