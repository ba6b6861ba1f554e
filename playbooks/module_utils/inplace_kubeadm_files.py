"""The ``kubeadm_files`` step's host work: the KubeadmConfig ``files`` of one machine written, and the
ones dropped since an earlier run forgotten. Shared by the role's own module (``inplace_files``) and
``inplace_steps`` (this step and the next in one execution); what it does is ``inplace_files``'s
docstring.
"""

from __future__ import annotations

import base64
import grp
import json
import os
import pwd
import re
from pathlib import Path
from typing import Any, NoReturn

from ansible.module_utils.inplace_atomic_file import replace_file
from ansible.module_utils.inplace_steps import Step, StepFailure

# the step's module arguments (``inplace_files``, and ``inplace_steps``'s ``kubeadm_files``)
OPTIONS: dict[str, Any] = {
    "files": {
        "type": "list",
        "elements": "dict",
        "required": True,
        "options": {
            "path": {"type": "str", "required": True},
            "content": {"type": "str", "default": "", "no_log": True},
            "owner": {"type": "str", "default": "root:root"},
            "permissions": {"type": "str", "default": "0644"},
            "append": {"type": "bool", "default": False},
        },
    },
    "manifest": {"type": "path", "default": "/var/lib/inplace-extension/kubeadm_files.json"},
}

IDLE: dict[str, Any] = {"changed": False, "written": [], "removed": []}  # the answer of a step left out


def step(name: str, params: dict[str, Any]) -> Step:
    """The step named ``name`` with its arguments (:data:`OPTIONS`), its inputs checked before anything
    on the host is touched (the lock included). Raises :class:`StepFailure` on invalid entries."""
    entries, errors = prepare(params["files"])
    if errors:
        raise StepFailure("invalid kubeadm files: " + "; ".join(errors))

    def work(check: bool) -> dict[str, Any]:
        return converge(entries, params["manifest"], check)

    return Step(name, work, IDLE)


MODE_RE = re.compile(r"^0?[0-7]{3,4}$")


def begin_marker(path: str) -> str:
    return f"# BEGIN inplace-extension {path}"


def end_marker(path: str) -> str:
    return f"# END inplace-extension {path}"


def validate_path(path: str) -> str | None:
    """Why ``path`` is refused, or None when it is acceptable."""
    if not path.startswith("/"):
        return "must be absolute"
    if any(c in path for c in "\0\n\r"):
        return "must not contain NUL or line breaks"
    if ".." in path.split("/"):
        return "must not contain '..'"
    if path.endswith("/") or os.path.normpath(path) != path:
        return "must be a normalised file path (no '//', '/./' or trailing '/')"
    return None


def resolve_owner(owner: str) -> tuple[int, int]:
    """``user:group`` (names or numeric ids) -> (uid, gid); a bare user means its primary group."""
    user, _, group = owner.partition(":")
    if not user:
        raise ValueError("owner must name a user ('user:group' or 'user')")
    try:
        pw = pwd.getpwuid(int(user)) if user.isdigit() else pwd.getpwnam(user)
        uid = pw.pw_uid
    except (KeyError, OverflowError):
        raise ValueError("owner names a user that does not exist on the host") from None
    if not group:
        return uid, pw.pw_gid
    try:
        gid = grp.getgrgid(int(group)).gr_gid if group.isdigit() else grp.getgrnam(group).gr_gid
    except (KeyError, OverflowError):
        raise ValueError("owner names a group that does not exist on the host") from None
    return uid, gid


def with_block(existing: str, path: str, content: str | None) -> str:
    """``existing`` with this path's marked block replaced by ``content`` (None: block removed).

    A new block goes to the end of the file, as cloud-init's ``append`` does.
    """
    begin, end = begin_marker(path), end_marker(path)
    lines = existing.splitlines(keepends=True)
    out: list[str] = []
    inside = False
    position = None
    for line in lines:
        stripped = line.rstrip("\r\n")
        if not inside and stripped == begin:
            inside = True
            position = len(out)
            continue
        if inside:
            if stripped == end:
                inside = False
            continue
        out.append(line)
    if inside:  # an unterminated block (edited by hand): drop only the marker we recognise
        out = [ln for ln in lines if ln.rstrip("\r\n") != begin]
        position = None
    if content is None:
        return "".join(out)
    body = content if content.endswith("\n") or not content else content + "\n"
    block = f"{begin}\n{body}{end}\n"
    if position is None:
        if out and not out[-1].endswith("\n"):
            out[-1] += "\n"
        out.append(block)
    else:
        out.insert(position, block)
    return "".join(out)


def read_text(path: Path) -> str | None:
    try:
        return path.read_bytes().decode("utf-8", errors="surrogateescape")
    except FileNotFoundError:
        return None


def write_atomic(path: Path, text: str, uid: int, gid: int, mode: int) -> None:
    path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    replace_file(path, text.encode("utf-8", errors="surrogateescape"), (uid, gid), mode)


def converge_file(
    entry: dict[str, Any],
    previous_append: bool | None,
    check: bool,
    diffs: list[dict[str, Any]] | None = None,
) -> bool:
    """Make one desired file true; True when anything changed. ``diffs`` (check mode) gets what would
    change of it (:func:`file_diff`)."""
    path = Path(entry["path"])
    uid, gid = entry["uid"], entry["gid"]
    mode = entry["mode"]
    if path.is_dir() and not path.is_symlink():
        raise ValueError("is a directory on the host")
    existing = read_text(path) if not path.is_symlink() else None
    if entry["append"]:
        # We owned the whole file before (append was false): start from nothing, not from our text.
        base = "" if previous_append is False or existing is None else existing
        desired = with_block(base, entry["path"], entry["content"])
    else:
        desired = entry["content"]
    if existing == desired:
        st = path.stat()
        if (st.st_uid, st.st_gid, st.st_mode & 0o7777) == (uid, gid, mode):
            return False
        if diffs is not None:
            diffs.append(
                file_diff(entry["path"], existing, desired, (st.st_uid, st.st_gid, st.st_mode), entry)
            )
        if not check:
            os.chown(path, uid, gid)
            path.chmod(mode)
        return True
    if diffs is not None:
        st_now = None if existing is None else path.stat()
        now = None if st_now is None else (st_now.st_uid, st_now.st_gid, st_now.st_mode)
        diffs.append(file_diff(entry["path"], existing, desired, now, entry))
    if not check:
        # Replacing a symlink replaces the link itself, never the file it points to.
        write_atomic(path, desired, uid, gid, mode)
    return True


def file_diff(
    path: str, existing: str | None, desired: str, now: tuple[int, int, int] | None, entry: dict[str, Any]
) -> dict[str, Any]:
    """What would change of one file, for the dry run (check mode): its owner and mode before and after,
    and its content before and after when the file is world-readable now and after (else the content is
    redacted: it may be a secret). The content goes base64-encoded: the module's ``content`` argument is
    ``no_log``, and Ansible masks such a value wherever it finds it in a result, which would leave a diff
    of stars; the dry run decodes it (plays/dry_run.py)."""
    after_meta = f"{entry['uid']}:{entry['gid']} {entry['mode']:04o}"
    diff: dict[str, Any] = {
        "path": path,
        "before_meta": None if now is None else f"{now[0]}:{now[1]} {now[2] & 0o7777:04o}",
        "after_meta": after_meta,
    }
    readable = entry["mode"] & 0o004 and (now is None or now[2] & 0o004)
    if existing == desired:
        return diff
    if not readable:
        diff["redacted"] = "content not shown: the file is not world-readable"
        return diff
    diff["before_b64"] = base64.b64encode((existing or "").encode("utf-8", "surrogateescape")).decode()
    diff["after_b64"] = base64.b64encode(desired.encode("utf-8", "surrogateescape")).decode()
    return diff


def remove_dropped(name: str, was_append: bool, check: bool) -> bool:
    path = Path(name)
    if path.is_symlink() or not path.is_file():
        return False
    if not was_append:
        if not check:
            path.unlink()
        return True
    existing = read_text(path) or ""
    remaining = with_block(existing, name, None)
    if remaining == existing:
        return False
    if not check:
        st = path.stat()
        write_atomic(path, remaining, st.st_uid, st.st_gid, st.st_mode & 0o7777)
    return True


def prepare(files: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """Validated entries plus the list of precise errors (by index, never quoting content)."""
    errors: list[str] = []
    seen: set[str] = set()
    entries: list[dict[str, Any]] = []
    for index, raw in enumerate(files):
        where = f"files[{index}]"
        path = raw["path"]
        reason = validate_path(path)
        if reason:
            errors.append(f"{where}.path {reason}")
            continue
        if path in seen:
            errors.append(f"{where}.path repeats an earlier entry's path")
            continue
        seen.add(path)
        if not MODE_RE.match(raw["permissions"] or ""):
            errors.append(f"{where}.permissions must be an octal mode such as '0644'")
            continue
        try:
            uid, gid = resolve_owner(raw["owner"] or "root:root")
        except ValueError as exc:
            errors.append(f"{where}.owner: {exc}")
            continue
        content = raw["content"] or ""
        if raw["append"] and {begin_marker(path), end_marker(path)} & set(content.splitlines()):
            errors.append(f"{where}.content contains this module's own marker line")
            continue
        entries.append(
            {
                "path": path,
                "content": content,
                "uid": uid,
                "gid": gid,
                "mode": int(raw["permissions"], 8),
                "append": bool(raw["append"]),
            }
        )
    return entries, errors


def load_manifest(path: Path) -> dict[str, bool]:
    """Previously managed path -> whether it was an append block."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise ValueError(f"manifest {path} is unreadable: {exc}") from None
    return {str(e["path"]): bool(e.get("append", False)) for e in data.get("files", [])}


def converge(entries: list[dict[str, Any]], manifest: str, check: bool) -> dict[str, Any]:
    """Write the files, remove the ones no longer listed and keep the manifest; the result fields.
    Raises :class:`StepFailure` (with ``written``: what was written before the failure)."""
    manifest_path = Path(manifest)
    try:
        previous = load_manifest(manifest_path)
    except ValueError as exc:
        raise StepFailure(str(exc)) from None
    written: list[str] = []
    removed: list[str] = []
    # What of ours is on the host right now, kept true as we go: a run that fails half-way records what
    # it wrote before it stops, or a later desired state that drops those files would never remove them.
    managed = dict(previous)

    def fail(msg: str) -> NoReturn:
        if not check:
            save_manifest(manifest_path, managed)
        raise StepFailure(msg, written=written)

    diffs: list[dict[str, Any]] | None = [] if check else None
    for entry in entries:
        try:
            changed = converge_file(entry, previous.get(entry["path"]), check, diffs)
        except (OSError, ValueError) as exc:
            fail(f"cannot write {entry['path']}: {exc.strerror if isinstance(exc, OSError) else exc}")
        managed[entry["path"]] = entry["append"]
        if changed:
            written.append(entry["path"])
    desired_paths = {e["path"] for e in entries}
    for path, was_append in sorted(previous.items()):
        if path not in desired_paths:
            try:
                if remove_dropped(path, was_append, check):
                    removed.append(path)
                    if diffs is not None:  # its content is not shown: it was ours, it may be a secret
                        diffs.append(
                            {"path": path, "removed": "removed" if not was_append else "block removed"}
                        )
            except OSError as exc:
                fail(f"cannot remove {path}: {exc.strerror}")
            del managed[path]
    manifest_changed = previous != managed or not manifest_path.exists()
    if manifest_changed and not check:
        save_manifest(manifest_path, {e["path"]: e["append"] for e in entries})
    result = {"changed": bool(written or removed or manifest_changed), "written": written, "removed": removed}
    if diffs is not None:
        result["inplace_diff"] = diffs
    return result


def save_manifest(path: Path, managed: dict[str, bool]) -> None:
    text = json.dumps(
        {"files": [{"path": p, "append": a} for p, a in managed.items()]}, indent=1, sort_keys=True
    )
    write_atomic(path, text + "\n", os.geteuid(), os.getegid(), 0o600)  # root under become
