#!/usr/bin/python3
"""Ansible module: converge the KubeadmConfig ``users`` of one machine in one module execution.

As a chain of tasks this was one ``group``/``user``/``file``/``copy`` execution per user and concern
(about twenty SSH round trips for two users, each about half a second on lab hosts). Here, in
the role's order, with ``groupadd``/``useradd``/``usermod`` (argv only, never a shell):

1. create the missing groups; create each missing user (home, GECOS, shell, primary group, groups) or
   change what differs on an existing one (groups are only added, as cloud-init does);
2. password hash, lock (``!`` before the hash, like ``usermod -L``; cloud-init locks by default) and
   expiry (``inactive``: expired on day 1, else cleared), compared with ``/etc/shadow`` first;
3. ``~/.ssh`` (0700) and ``authorized_keys`` (0600, exactly the listed keys), never through a symlink;
4. sudo drop-ins ``<sudoers_dir>/<prefix><user>`` (0440, ``visudo -cf`` before the rename), and
   removal of our drop-ins of users without a rule;
5. disable (expire, lock, remove the keys of) managed users that left the list, if they still exist;
   never delete them (their files and processes would be orphaned); then rewrite the manifest.
   A run that fails half-way records the users it got to as well, so none is left unmanaged.

The role checked the inputs before (names, groups, paths, one-line fields). The hash is never returned.

In check mode (the dry run, ``plan --hosts``) nothing is run or written: each command and file change
it would make is described in ``inplace_changes`` instead, one line each (names, groups, shells, key
counts; never a password hash or a key).
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import re
import stat
import subprocess
from pathlib import Path
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.inplace_atomic_file import replace_file

DOCUMENTATION = r"""
module: inplace_users
short_description: Converge the users of a KubeadmConfig on a host, disabling the dropped ones
options:
  users: {description: The users (role input users_users)., type: list, elements: dict, required: true}
  default_lock_password: {description: Lock when a user says nothing (cloud-init's default)., type: bool,
                          default: true}
  sudoers_dir: {description: Directory of the sudo drop-ins., type: path, default: /etc/sudoers.d}
  sudoers_prefix: {description: Name prefix of our drop-ins., type: str, default: inplace-extension-}
  visudo: {description: visudo binary., type: path, default: /usr/sbin/visudo}
  manifest: {description: Where the names of the managed users are kept., type: path, required: true}
  name_pattern: {description: Names a manifest entry must match to be acted on., type: str, required: true}
"""

RETURN = r"""
changed_users: {description: Users created or changed., type: list, elements: str}
disabled: {description: Users that left the list and were disabled., type: list, elements: str}
inplace_changes: {description: Check mode only, what would change, one line each., type: list, elements: str}
"""

# the role's argument spec (meta/argument_specs.yml), so that Ansible masks the hash in what it returns
STR, BOOL = {"type": "str"}, {"type": "bool"}
USER_OPTIONS = {
    "name": {"type": "str", "required": True},
    "gecos": STR,
    "home_dir": STR,
    "shell": STR,
    "groups": {"type": "raw"},  # a list, or a comma-separated string as cloud-init takes it
    "inactive": BOOL,
    "lock_password": BOOL,
    "primary_group": STR,
    "sudo": STR,
    "passwd": {"type": "str", "no_log": True},
    "ssh_authorized_keys": {"type": "list", "elements": "str", "required": True},
}
EXPIRED = "1970-01-02"  # day 1: an account expired for good (day 0 means "never" to some tools)
SHADOW = Path("/etc/shadow")


def _shadow() -> dict[str, list[str]]:
    entries = {}
    for line in SHADOW.read_text(encoding="utf-8").splitlines():
        fields = line.split(":")
        if len(fields) >= 9:
            entries[fields[0]] = fields
    return entries


def _group_list(value: Any) -> list[str]:
    items = value.split(",") if isinstance(value, str) else (value or [])
    return [g.strip() for g in items if g and g.strip()]


class Users:
    def __init__(self, module: AnsibleModule) -> None:
        self.module = module
        self.p = module.params
        self.changed_users: dict[str, None] = {}  # ordered set
        self.dry = module.check_mode
        self.would: list[str] = []  # check mode: what would change, one line each

    def run(self, argv: list[str]) -> None:
        if self.dry:
            self.would.append(_described(argv))
            return
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            # argv may hold the password hash: name the command and the user only
            raise StepFailed(
                f"{argv[0]} failed for {argv[-1]} (rc {proc.returncode}): {proc.stderr.strip()[-300:]}"
            )

    def groups(self) -> None:
        wanted: list[str] = []
        for user in self.p["users"]:
            wanted += _group_list(user.get("groups"))
            if user.get("primary_group"):
                wanted.append(user["primary_group"])
        for name in dict.fromkeys(wanted):
            try:
                grp.getgrnam(name)
            except KeyError:
                self.run(["groupadd", name])

    def account(self, user: dict[str, Any]) -> None:
        name, groups = user["name"], _group_list(user.get("groups"))
        fields = [("-c", user.get("gecos")), ("-d", user.get("home_dir")), ("-s", user.get("shell"))]
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            argv = ["useradd", "-m"]
            argv += [arg for flag, value in fields if value for arg in (flag, value)]
            own_group = any(g.gr_name == name for g in grp.getgrall())
            primary = user.get("primary_group") or (name if own_group else None)
            argv += ["-g", primary] if primary else []  # without it useradd makes the user's own group
            argv += ["-G", ",".join(groups)] if groups else []
            self.run([*argv, name])
            self.changed_users[name] = None
            return
        current = {"-c": entry.pw_gecos, "-d": entry.pw_dir, "-s": entry.pw_shell}
        argv = [arg for flag, value in fields if value and current[flag] != value for arg in (flag, value)]
        if user.get("primary_group") and _gid(user["primary_group"]) != entry.pw_gid:
            argv += ["-g", user["primary_group"]]
        member_of = {g.gr_name for g in grp.getgrall() if name in g.gr_mem}
        missing = [g for g in groups if g not in member_of and _gid(g) != entry.pw_gid]
        argv += ["-a", "-G", ",".join(missing)] if missing else []  # added, never removed
        if argv:
            self.run(["usermod", *argv, name])
            self.changed_users[name] = None

    def password_and_expiry(self, user: dict[str, Any]) -> None:
        name = user["name"]
        if self.dry and name not in _shadow():  # created by this run: useradd says so already
            return
        entry = _shadow()[name]
        lock = user.get("lock_password")
        lock = self.p["default_lock_password"] if lock is None else lock
        current_hash, wanted_hash = entry[1], entry[1]
        if user.get("passwd"):
            wanted_hash = ("!" if lock else "") + user["passwd"]
        elif lock and not current_hash.startswith("!"):
            wanted_hash = "!" + current_hash  # usermod refuses to unlock without a hash: never unlocked
        argv = ["-p", wanted_hash] if wanted_hash != current_hash else []
        if user.get("inactive") is not None:
            expiry = "1" if user["inactive"] else ""
            if entry[7] != expiry:
                argv += ["-e", EXPIRED if user["inactive"] else ""]
        if argv:
            self.run(["usermod", *argv, name])
            self.changed_users[name] = None

    def keys(self, user: dict[str, Any]) -> None:
        keys = user.get("ssh_authorized_keys") or []
        try:
            entry = pwd.getpwnam(user["name"])
        except KeyError:
            if not self.dry:
                raise
            self.would.append(f"user {user['name']}: {len(keys)} SSH authorized key(s)")  # a new user
            return
        ssh = Path(entry.pw_dir) / ".ssh"
        content = ("\n".join(keys) + "\n") if keys else ""
        owner = (entry.pw_uid, entry.pw_gid)
        changed = _ensure_dir(ssh, 0o700, owner, self.dry)
        changed = (
            _ensure_file(ssh / "authorized_keys", content.encode(), 0o600, owner, dry=self.dry) or changed
        )
        if changed:
            self.changed_users[user["name"]] = None
            if self.dry:
                self.would.append(f"user {user['name']}: SSH authorized keys changed ({len(keys)} key(s))")

    def sudo(self) -> bool:
        directory, prefix = Path(self.p["sudoers_dir"]), self.p["sudoers_prefix"]
        wanted = {
            f"{prefix}{u['name']}": f"{u['name']} {u['sudo']}\n" for u in self.p["users"] if u.get("sudo")
        }
        changed = False
        for file_name, rule in wanted.items():
            written = _ensure_file(directory / file_name, rule.encode(), 0o440, (0, 0), self.visudo, self.dry)
            if written and self.dry:
                self.would.append(f"sudo rule {directory / file_name}: {rule.strip()}")
            changed = written or changed
        for path in sorted(directory.glob(f"{prefix}*")):
            if path.name not in wanted and path.is_file():
                if self.dry:
                    self.would.append(f"sudo rule {path} removed")
                else:
                    path.unlink()
                changed = True
        return changed

    def visudo(self, path: Path) -> None:
        proc = subprocess.run(
            [self.p["visudo"], "-cf", str(path)], capture_output=True, text=True, check=False
        )
        if proc.returncode != 0:
            path.unlink()
            raise StepFailed(f"visudo refused the sudo rule for {path.name}: {proc.stdout.strip()}")

    def disable_dropped(self, previous: list[str]) -> list[str]:
        names = {u["name"] for u in self.p["users"]}
        pattern = re.compile(self.p["name_pattern"])
        disabled = []
        for name in sorted({n for n in previous if isinstance(n, str)} - names):
            if not pattern.match(name):
                continue
            try:
                entry = pwd.getpwnam(name)
            except KeyError:
                continue  # deleted by someone else: disabling must never create an account
            shadow = _shadow().get(name)
            argv = [] if shadow and shadow[7] == "1" else ["-e", EXPIRED]
            argv += [] if shadow and shadow[1].startswith("!") else ["-L"]
            keys = Path(entry.pw_dir) / ".ssh" / "authorized_keys"
            if argv:
                self.run(["usermod", *argv, name])
            if keys.is_file() and not keys.is_symlink():
                if self.dry:
                    self.would.append(f"user {name}: SSH authorized keys removed (left the list)")
                else:
                    keys.unlink()
            elif not argv:
                continue
            disabled.append(name)
        return disabled


class RefusedPath(Exception):
    """A path the module will not write through (not what it should be, or a symlink)."""


class StepFailed(Exception):
    """A command (groupadd, useradd, usermod, visudo) failed; the message names it, never its argv."""


def _gid(group: str) -> int | None:
    """A group's id; None for a group that does not exist yet (check mode: groupadd did not run)."""
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        return None


def _described(argv: list[str]) -> str:
    """One line for the dry run saying what a command would do: names and settings, never the hash."""
    command, name, flags = argv[0], argv[-1], argv[1:-1]
    if command == "groupadd":
        return f"group {name} added"
    words = {
        "-c": "GECOS",
        "-d": "home",
        "-s": "shell",
        "-g": "primary group",
        "-G": "groups",
        "-e": "expiry",
    }
    said: list[str] = []
    index = 0
    while index < len(flags):
        flag = flags[index]
        if flag in ("-m", "-a"):
            index += 1
            continue
        if flag == "-L":
            said.append("password locked")
            index += 1
            continue
        value = flags[index + 1] if index + 1 < len(flags) else ""
        if flag == "-p":
            said.append("password hash or lock changed")
        elif flag == "-e":
            said.append("expired (disabled)" if value else "expiry cleared")
        else:
            said.append(f"{words.get(flag, flag)} {value}")
        index += 2
    what = "added" if command == "useradd" else "changed"
    return f"user {name} {what}" + (f": {', '.join(said)}" if said else "")


def _ensure_dir(path: Path, mode: int, owner: tuple[int, int], dry: bool = False) -> bool:
    try:
        st = path.lstat()
    except FileNotFoundError:
        if dry:
            return True
        path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        path.mkdir(mode=mode)
        os.chown(path, *owner)
        path.chmod(mode)
        return True
    if not stat.S_ISDIR(st.st_mode):  # e.g. a symlink the user planted: never followed
        raise RefusedPath(f"{path} is not a directory")
    if (st.st_uid, st.st_gid) == owner and stat.S_IMODE(st.st_mode) == mode:
        return False
    if dry:
        return True
    os.chown(path, *owner, follow_symlinks=False)
    path.chmod(mode)
    return True


def _ensure_file(
    path: Path, content: bytes, mode: int, owner: tuple[int, int], check: Any = None, dry: bool = False
) -> bool:
    """Write ``path`` atomically unless it already holds ``content`` with ``mode`` and ``owner``
    (``dry``: only say whether it would)."""
    try:
        st = path.lstat()
        if not stat.S_ISREG(st.st_mode):
            raise RefusedPath(f"{path} is not a regular file")
        if (st.st_uid, st.st_gid) == owner and stat.S_IMODE(st.st_mode) == mode:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as fh:
                if fh.read() == content:
                    return False
    except FileNotFoundError:
        pass
    if not dry:
        replace_file(path, content, owner, mode, check)
    return True


def _record(manifest: Path, names: list[str], dry: bool = False) -> bool:
    """Write the manifest of the users we manage; True when it changed (``dry``: when it would)."""
    record = json.dumps({"users": names}, indent=4, sort_keys=True) + "\n"
    if dry:
        return _ensure_file(manifest, record.encode(), 0o600, (0, 0), dry=True)
    manifest.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    return _ensure_file(manifest, record.encode(), 0o600, (0, 0))


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "users": {"type": "list", "elements": "dict", "required": True, "options": USER_OPTIONS},
            "default_lock_password": {"type": "bool", "default": True},
            "sudoers_dir": {"type": "path", "default": "/etc/sudoers.d"},
            "sudoers_prefix": {"type": "str", "default": "inplace-extension-"},
            "visudo": {"type": "path", "default": "/usr/sbin/visudo"},
            "manifest": {"type": "path", "required": True},
            "name_pattern": {"type": "str", "required": True},
        },
        supports_check_mode=True,
    )
    for user in module.params["users"]:
        if user.get("passwd"):
            module.no_log_values.add(user["passwd"])  # scrubbed from anything the module returns
    users = Users(module)
    manifest = Path(module.params["manifest"])
    try:
        previous = json.loads(manifest.read_text(encoding="utf-8")).get("users", [])
    except (OSError, ValueError, AttributeError):
        previous = []
    previous = previous if isinstance(previous, list) else []
    # Users this run may have created or changed so far: recorded even when it fails half-way, so that
    # a later list without them still disables them (the manifest holds every user of ours on the host).
    touched = [name for name in previous if isinstance(name, str)]
    try:
        users.groups()
        for user in module.params["users"]:
            if user["name"] not in touched:
                touched.append(user["name"])
            users.account(user)
            users.password_and_expiry(user)
            users.keys(user)
        sudo_changed = users.sudo()
        disabled = users.disable_dropped(previous)
    except (RefusedPath, StepFailed) as exc:
        _record(manifest, touched, users.dry)
        module.fail_json(msg=f"refusing to write: {exc}" if isinstance(exc, RefusedPath) else str(exc))
    manifest_changed = _record(manifest, [u["name"] for u in module.params["users"]], users.dry)
    module.exit_json(
        changed=bool(users.changed_users or sudo_changed or disabled or manifest_changed or users.would),
        changed_users=list(users.changed_users),
        disabled=disabled,
        **({"inplace_changes": users.would} if users.dry else {}),
    )


if __name__ == "__main__":
    main()
