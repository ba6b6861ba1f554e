"""The lab helpers' reads of the API server: one HTTP client per lab and process, and the resolution of
kubectl's resource names (``node``, ``machines.cluster.x-k8s.io``, ``pdb``...) through API discovery.

Tests poll objects every 0.25-1 s for minutes; a ``kubectl get`` costs ~68 ms of CPU to start, the GET
over a kept-alive connection a fraction of it. So :func:`get` and :func:`list_objects` answer what
``kubectl get -o json`` answers (the object, or the list's items with ``apiVersion`` and ``kind``; the
``managedFields`` left out as kubectl leaves them out) over one ``httpx.Client`` per lab. Writes stay
kubectl's (``Lab.kubectl``).

Resolution: a name matches a resource's plural, singular, kind or short name (case-insensitive), in
any group, or in the group after its first dot (``machine.machine.sapcloud.io``); a group's preferred
version serves it. The discovery is cached per lab and read again once when a name is not found (tests
install CRDs after the lab starts). Where several groups serve the name, the core group wins, as with
kubectl; any other tie, an unknown name, or a 404 that is no object's NotFound is left to kubectl, so its
answer (and its error text) stays kubectl's.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import httpx
from hostlab.errors import LabError

if TYPE_CHECKING:
    from kubelab.lab import Lab

Obj = dict[str, Any]
DEFAULT_NAMESPACE = "default"  # the lab kubeconfig's context names none: kubectl's default


@dataclasses.dataclass(frozen=True)
class Resource:
    """One resource of the API: where it is served and the names kubectl accepts for it."""

    group: str  # "" for the core group
    version: str  # the group's preferred version
    plural: str
    kind: str
    namespaced: bool
    names: frozenset[str]  # plural, singular, kind, short names; lower case

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None, name: str | None = None) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        where = f"/namespaces/{namespace}" if self.namespaced and namespace is not None else ""
        return f"{base}{where}/{self.plural}" + (f"/{name}" if name is not None else "")


class Unresolved(Exception):
    """No single resource answers to the name: kubectl decides (and words the error)."""


def resources(discover: Callable[[str], Obj | None]) -> list[Resource]:
    """Every resource the API serves, from the core group's ``/api/v1`` and each group's preferred version
    under ``/apis``; ``discover(path)`` is the JSON at the path, None when the path does not answer (an
    aggregated API that is down: kubectl too goes on without it)."""
    found = _group_version(discover("/api/v1"), "")
    for group in (discover("/apis") or {}).get("groups", []):
        preferred = group.get("preferredVersion") or (group.get("versions") or [{}])[0]
        if preferred.get("groupVersion"):
            found += _group_version(discover(f"/apis/{preferred['groupVersion']}"), group["name"])
    return found


def _group_version(listing: Obj | None, group: str) -> list[Resource]:
    if listing is None:
        return []
    version = str(listing["groupVersion"]).rpartition("/")[2]
    found = []
    for r in listing.get("resources", []):
        if "/" in r["name"]:  # a subresource (pods/status)
            continue
        kind = str(r["kind"])
        names = {r["name"], r.get("singularName") or kind.lower(), kind.lower(), *r.get("shortNames", [])}
        lower = frozenset(n.lower() for n in names)
        found.append(Resource(group, version, r["name"], kind, bool(r["namespaced"]), lower))
    return found


def resolve(known: list[Resource], name: str) -> Resource | None:
    """The resource kubectl means by ``name``; None if none matches; :class:`Unresolved` if several in
    groups other than the core group do."""
    wanted = name.lower()
    matches = [r for r in known if wanted in r.names]
    bare, _, group = wanted.partition(".")
    if group:  # kubectl reads "<resource>.<group>" first; "<resource>.<version>.<group>" is kubectl's
        matches = [r for r in known if r.group == group and bare in r.names] or matches
    if len({(r.group, r.plural) for r in matches}) <= 1:
        return matches[0] if matches else None
    core = [r for r in matches if r.group == ""]
    if len(core) == 1:
        return core[0]
    raise Unresolved(f"{name!r} names several resources: {sorted(f'{r.plural}.{r.group}' for r in matches)}")


class Reader:
    """One lab's reads: its HTTP client (shared by threads: httpx's Client is) and its discovery."""

    def __init__(self, client: httpx.Client, identity: tuple[str, int] = ("", 0)) -> None:
        self.server = str(client.base_url)
        self.identity = identity
        self.client = client
        self._lock = threading.Lock()
        self._known: list[Resource] | None = None

    def close(self) -> None:
        self.client.close()

    def resource(self, name: str) -> Resource:
        """The resource ``name`` means; raises :class:`Unresolved` for kubectl to decide."""
        with self._lock:
            if self._known is not None:
                found = resolve(self._known, name)
                if found is not None:
                    return found
            self._known = resources(self._discover)  # first use, or a miss: a CRD installed since
            found = resolve(self._known, name)
        if found is None:
            raise Unresolved(f"no resource {name!r} in the API's discovery")
        return found

    def forget(self) -> None:
        """Read the discovery again at the next resolution (a resource served no more)."""
        with self._lock:
            self._known = None

    def _discover(self, path: str) -> Obj | None:
        response = self._request(path)
        if response.status_code != 200:
            return None
        body: Obj = response.json()
        return body

    def _request(self, path: str, params: Mapping[str, str] | None = None) -> httpx.Response:
        response = self._send(path, params)
        for _ in range(RETRIES - 1):
            wait = _retry_after(response)
            if wait is None:
                break
            time.sleep(wait)
            response = self._send(path, params)
        return response

    def _send(self, path: str, params: Mapping[str, str] | None) -> httpx.Response:
        try:
            try:
                return self.client.get(path, params=params)
            except httpx.TransportError:
                # a kept connection the server closed as we sent (idle, or the API server restarted):
                # once more on a new one, as a new kubectl would have used
                return self.client.get(path, params=params)
        except httpx.HTTPError as exc:
            raise LabError(f"kubelab: GET {self.server}{path} failed: {exc!r}") from exc

    def get(self, resource: Resource, name: str, namespace: str | None) -> Obj | None:
        path = resource.path(namespace or DEFAULT_NAMESPACE, name)
        response = self._request(path)
        if response.status_code == 404:
            if _not_found(response, name):
                return None
            self.forget()  # the resource itself is gone (a CRD deleted): kubectl decides
            raise Unresolved(f"GET {path}: 404 {response.text.strip()}")
        obj = self._json(response, path)
        obj.get("metadata", {}).pop("managedFields", None)
        return obj

    def list(
        self,
        resource: Resource,
        namespace: str | None,
        labels: str | None = None,
        fields: str | None = None,
    ) -> list[Obj]:
        path = resource.path(namespace)
        params = {k: v for k, v in (("labelSelector", labels), ("fieldSelector", fields)) if v}
        response = self._request(path, params)
        if response.status_code == 404:  # a list answers even for a namespace that does not exist
            self.forget()
            raise Unresolved(f"GET {path}: 404 {response.text.strip()}")
        items: list[Obj] = self._json(response, path, params).get("items") or []
        # a list's items come without apiVersion and kind; kubectl's -o json list sets them
        listed = [{"apiVersion": resource.api_version, "kind": resource.kind, **item} for item in items]
        for item in listed:
            item.get("metadata", {}).pop("managedFields", None)
        return listed

    def _json(self, response: httpx.Response, path: str, params: Mapping[str, str] | None = None) -> Obj:
        if response.status_code != 200:
            query = "?" + str(httpx.QueryParams(params)) if params else ""
            raise LabError(
                f"kubelab: GET {path}{query}: {response.status_code} {response.text.strip()[:2000]}"
            )
        body: Obj = response.json()
        return body


# kubectl (client-go) sends a request again when the API server answers 429, or a 5xx with Retry-After
# ("storage is (re)initializing" while it starts again), after the seconds it names, up to 10 times
RETRIES = 10
RETRY_AFTER_CAP = 5.0  # seconds; the API server names 1


def _retry_after(response: httpx.Response) -> float | None:
    """The seconds to wait before sending again, or None when the answer is final."""
    header = response.headers.get("Retry-After")
    if response.status_code != 429 and not (response.status_code >= 500 and header):
        return None
    try:
        seconds = float(header) if header else 1.0
    except ValueError:
        seconds = 1.0
    return min(max(seconds, 0.1), RETRY_AFTER_CAP)


def _not_found(response: httpx.Response, name: str) -> bool:
    """The 404 is the object's own NotFound (not a path the API does not serve)."""
    try:
        body = response.json()
    except json.JSONDecodeError:
        return False
    return bool(body.get("reason") == "NotFound" and body.get("details", {}).get("name") == name)


# -- one reader per lab and process -------------------------------------------------------------------
_readers: dict[str, Reader] = {}
_readers_lock = threading.Lock()


def reader(lab: Lab) -> Reader:
    """The lab's reader, made at first use; a lab that came up again (another server or CA) gets a new one."""
    key, identity = str(lab.dir), _identity(lab)
    with _readers_lock:
        current = _readers.get(key)
        if current is not None and current.identity == identity:
            return current
        if current is not None:
            current.close()
        current = _readers[key] = Reader(lab.http(), identity)
        return current


def _identity(lab: Lab) -> tuple[str, int]:
    """The lab's server and its CA's mtime: a lab brought up again has a new CA, perhaps on the same port."""
    try:
        ca = lab.ca.stat().st_mtime_ns
    except OSError:
        ca = 0
    return lab.server, ca


def close(lab: Lab) -> None:
    """Close the lab's reader (the lab goes down)."""
    with _readers_lock:
        current = _readers.pop(str(lab.dir), None)
    if current is not None:
        current.close()


@atexit.register
def _close_all() -> None:
    with _readers_lock:
        readers = list(_readers.values())
        _readers.clear()
    for current in readers:
        current.close()


def get(lab: Lab, kind: str, name: str, namespace: str | None = None) -> Obj | None:
    """``kubectl get <kind> <name> [-n <namespace>] -o json``: the object, or None if it does not exist."""
    try:
        lab_reader = reader(lab)
        return lab_reader.get(lab_reader.resource(kind), name, namespace)
    except Unresolved:
        return _kubectl_get(lab, kind, name, namespace)


def list_objects(
    lab: Lab,
    kind: str,
    namespace: str | None = None,
    labels: str | None = None,
    fields: str | None = None,
    all_namespaces: bool = False,
) -> list[Obj]:
    """``kubectl get <kind> [-n <namespace> | -A] [-l <labels>] [--field-selector <fields>] -o json``'s
    items, in the API's order (by namespace and name)."""
    try:
        lab_reader = reader(lab)
        resource = lab_reader.resource(kind)
        where = None if all_namespaces else (namespace or DEFAULT_NAMESPACE)
        return lab_reader.list(resource, where, labels, fields)
    except Unresolved:
        args = ["get", kind, *(["-A"] if all_namespaces else ["-n", namespace] if namespace else [])]
        args += [*(["-l", labels] if labels else []), *(["--field-selector", fields] if fields else [])]
        items: list[Obj] = json.loads(lab.kubectl(*args, "-o", "json").stdout)["items"]
        return items


def _kubectl_get(lab: Lab, kind: str, name: str, namespace: str | None) -> Obj | None:
    args = ["get", kind, name, "-o", "json", *(["-n", namespace] if namespace else [])]
    proc = lab.kubectl(*args, check=False)
    if proc.returncode != 0:
        if "NotFound" in proc.stderr:
            return None
        raise LabError(f"kubectl {' '.join(args)}: {proc.stderr.strip()}")
    result: Obj = json.loads(proc.stdout)
    return result
