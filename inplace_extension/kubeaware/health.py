"""User-defined checks of the health gate: HTTP GETs against the updated host (capabilities file).

Deterministic messages: the check's name and the status or the error class, never a response body.
"""

from __future__ import annotations

from collections.abc import Sequence

from inplace_extension.inplace.custom import HealthCheck

ADDRESS = "{address}"


def url_for(check: HealthCheck, address: str | None) -> str | None:
    """The check's URL with ``{address}`` filled in (IPv6 in brackets); None when it needs an unknown one."""
    if ADDRESS not in check.url:
        return check.url
    if address is None:
        return None
    return check.url.replace(ADDRESS, f"[{address}]" if ":" in address else address)


def first_failing(checks: Sequence[HealthCheck], address: str | None) -> str | None:
    """What the gate still waits for: the first failing check, in file order (None when all pass)."""
    if not checks:
        return None
    # imported here, not at start-up: most capabilities files have no check, and httpx with what it
    # imports (its command line's too, when click or rich is installed) is a tenth of an attempt Job's
    # start-up CPU (bench/README.md, issue 43 item 3)
    import httpx

    for check in checks:
        url = url_for(check, address)
        if url is None:
            return f"check {check.name}: the host address is not known"
        try:
            # no redirects: the check names the exact endpoint; a redirect is a different answer
            status = httpx.get(url, timeout=check.timeout_seconds, follow_redirects=False).status_code
        except httpx.HTTPError as exc:
            return f"check {check.name}: {type(exc).__name__}"
        if status != check.status:
            return f"check {check.name}: HTTP {status}, expected {check.status}"
    return None
