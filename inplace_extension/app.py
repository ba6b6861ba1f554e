"""The HTTP edge: routes from the HOOKS table, bytes -> model -> handler -> 200 JSON; /healthz, /readyz.

Transport errors are the only non-200 answers: 404 (unknown path) and 405 (wrong method) from the
router, 413 for a body over the cap. Everything else a hook can go through becomes HTTP 200 with
``status`` (docs/capi-hooks.md §1.2), mapped in one place by :func:`inplace_extension.errors.answer_for`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio.to_thread
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from inplace_extension.api.body import parse_json, parse_request
from inplace_extension.api.common import CommonResponse, ResponseStatus
from inplace_extension.auth import AuthMiddleware, AuthPolicy
from inplace_extension.errors import InvalidRequest, RequestTooLarge, answer_for
from inplace_extension.hooks.context import HookContext, InfraTagsPoller
from inplace_extension.hooks.table import HOOKS, Hook, hook_of_body
from inplace_extension.inplace.custom import NO_CUSTOM, CustomTable
from inplace_extension.metrics import HookStatus, Metrics
from inplace_extension.runs.model import Runs
from inplace_extension.settings import Settings

logger = logging.getLogger(__name__)

JSON_TYPE = "application/json"
# bodies above this are parsed in a worker thread so one big request cannot stall every other caller
THREAD_PARSE_BYTES = 256 * 1024


def normalize_prefix(prefix: str) -> str:
    """``""``/``"/"`` -> ``""``; ``"ext/"`` -> ``"/ext"`` (CAPI joins the ExtensionConfig path, path.Join)."""
    stripped = prefix.strip().strip("/")
    return f"/{stripped}" if stripped else ""


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, refused as soon as it is known to pass ``limit`` (header first, then as read)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise RequestTooLarge(limit)
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:  # chunked or lying Content-Length: stop reading here
            raise RequestTooLarge(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _json(body: bytes, status_code: int = 200) -> Response:
    return Response(body, status_code=status_code, media_type=JSON_TYPE)


def other_hook(hook: Hook[Any, Any], body: bytes, prefix: str) -> InvalidRequest | None:
    """When a body that does not fit ``hook`` was written for another hook: say which, and its path."""
    try:
        found = hook_of_body(parse_json(body))
    except InvalidRequest:
        return None
    if found is None or found[0] is hook:
        return None
    other, shown_by = found
    where = "kind" if shown_by.startswith("its kind") else "(body)"
    return InvalidRequest(
        where,
        f"this is {article(other.hook)} {other.hook} request ({shown_by}), not {hook.hook}; "
        f"post it to {prefix}{other.path}",
    )


def article(word: str) -> str:
    """'an' before a vowel sound ("an UpdateMachine request"), else 'a'."""
    return "an" if word[:1].lower() in "aeiou" else "a"


def hook_endpoint(
    hook: Hook[Any, Any], context: HookContext, metrics: Metrics, prefix: str = ""
) -> Callable[[Request], Awaitable[Response]]:
    """The route endpoint of ``hook``: bytes -> model -> handler -> 200 JSON; every failure an answer."""
    limit = context.settings.max_body_bytes

    async def endpoint(request: Request) -> Response:
        started = time.perf_counter()
        body = b""
        try:
            body = await read_body(request, limit)
            if len(body) > THREAD_PARSE_BYTES:
                model = await anyio.to_thread.run_sync(parse_request, hook.request_model, body)
            else:
                model = parse_request(hook.request_model, body)
            response: CommonResponse = await hook.handler(model, context)
        except Exception as exc:  # the edge's catch-all: every failure still answers, a bug as InternalError
            if isinstance(exc, InvalidRequest):
                exc = other_hook(hook, body, prefix) or exc
            answer = answer_for(exc)
            if answer.is_bug:
                logger.exception("hook=%s decision=failure reason=InternalError", hook.hook)
            else:
                logger.info("hook=%s decision=failure reason=%s", hook.hook, answer.message.split(":", 1)[0])
            if answer.http_status != 200:
                failure = {"status": "Failure", "message": answer.message}
                # the rest of the body is not read: close the connection rather than drain it
                return JSONResponse(failure, status_code=answer.http_status, headers={"connection": "close"})
            response = hook.failure(answer.message)
        status: HookStatus = "Success" if response.status is ResponseStatus.SUCCESS else "Failure"
        metrics.observe_hook(hook.hook, status, time.perf_counter() - started)
        return _json(response.to_wire())

    return endpoint


def http_error(hook_paths: list[str]) -> Callable[[Request, Exception], Awaitable[Response]]:
    """The router's own 404/405 (transport errors for CAPI) as JSON, so curl users see why; a 404 lists
    the hook paths (a typo in an ExtensionConfig's path or a missing --path-prefix shows at once)."""

    async def answer(request: Request, exc: Exception) -> Response:
        if not isinstance(exc, HTTPException):  # registered for HTTPException only; keep mypy honest
            raise exc
        reason = {404: "NotFound", 405: "MethodNotAllowed"}.get(exc.status_code, "HTTPError")
        message = f"{reason}: {exc.detail}"
        if exc.status_code == 404:
            message += "; the hook paths are " + ", ".join(hook_paths)
        return JSONResponse(
            {"status": "Failure", "message": message}, status_code=exc.status_code, headers=exc.headers
        )

    return answer


def create_app(
    settings: Settings,
    runs: Runs | None = None,
    metrics: Metrics | None = None,
    custom: CustomTable = NO_CUSTOM,
    hosts_problem: Callable[[], str | None] = lambda: None,
    infra_tags: InfraTagsPoller | None = None,
) -> Starlette:
    """The ASGI app. ``executor`` runs UpdateMachine; without one UpdateMachine answers a clear Failure.

    ``custom``: the user-defined capabilities (``--capabilities-file``), already loaded and checked.
    ``hosts_problem``: why UpdateMachine cannot reach any host now, if so (``/readyz`` says it).
    ``infra_tags``: the Kubernetes-aware mode's wait for provider-applied infrastructure tags.
    """
    context = HookContext(settings=settings, hooks=HOOKS, runs=runs, custom=custom, infra_tags=infra_tags)
    metrics = metrics or Metrics()
    prefix = normalize_prefix(settings.path_prefix)
    hook_paths = [prefix + hook.path for hook in HOOKS]

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> Response:
        # CanUpdate* and Discovery need nothing beyond this process (ready, 200); report whether updates
        # can run, and why they cannot reach any host when that is so
        ready: dict[str, Any] = {"status": "ready", "hooks": hook_paths, "executor": runs is not None}
        problem = hosts_problem() if runs is not None else None
        if problem is not None:
            ready["updates"] = problem
        return JSONResponse(ready)

    # one table: a route per hook of HOOKS (as Discovery announces them), then the probes and /metrics
    routes = [
        Route(path, hook_endpoint(hook, context, metrics, prefix), methods=["POST"])
        for path, hook in zip(hook_paths, HOOKS, strict=True)
    ]
    routes += [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics.endpoint, methods=["GET"]),
    ]
    # auth outermost, so no body is read before the caller is known (inplace_extension/auth.py)
    policy = AuthPolicy.build(settings.client_ca, settings.bearer_token_file, settings.plain_http)
    middleware = [Middleware(AuthMiddleware, policy=policy)] if policy.enabled else []
    return Starlette(
        routes=routes, middleware=middleware, exception_handlers={HTTPException: http_error(hook_paths)}
    )
