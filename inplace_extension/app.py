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

from inplace_extension.api.body import parse_request
from inplace_extension.api.common import CommonResponse, ResponseStatus
from inplace_extension.auth import AuthMiddleware, AuthPolicy
from inplace_extension.errors import RequestTooLarge, answer_for
from inplace_extension.hooks.context import HookContext
from inplace_extension.hooks.table import HOOKS, Hook
from inplace_extension.inplace.custom import NO_CUSTOM, CustomTable
from inplace_extension.metrics import HookStatus, Metrics
from inplace_extension.runs.model import Executor
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


def hook_endpoint(
    hook: Hook[Any, Any], context: HookContext, metrics: Metrics
) -> Callable[[Request], Awaitable[Response]]:
    """The route endpoint of ``hook``: bytes -> model -> handler -> 200 JSON; every failure an answer."""
    limit = context.settings.max_body_bytes

    async def endpoint(request: Request) -> Response:
        started = time.perf_counter()
        try:
            body = await read_body(request, limit)
            if len(body) > THREAD_PARSE_BYTES:
                model = await anyio.to_thread.run_sync(parse_request, hook.request_model, body)
            else:
                model = parse_request(hook.request_model, body)
            response: CommonResponse = await hook.handler(model, context)
        except Exception as exc:  # the edge's catch-all: every failure still answers, a bug as InternalError
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


async def _http_error(request: Request, exc: Exception) -> Response:
    # the router's own 404/405 (transport errors for CAPI), as JSON so curl users see why
    if not isinstance(exc, HTTPException):  # registered for HTTPException only; keep mypy honest
        raise exc
    reason = {404: "NotFound", 405: "MethodNotAllowed"}.get(exc.status_code, "HTTPError")
    return JSONResponse(
        {"status": "Failure", "message": f"{reason}: {exc.detail}"},
        status_code=exc.status_code,
        headers=exc.headers,
    )


def create_app(
    settings: Settings,
    executor: Executor | None = None,
    metrics: Metrics | None = None,
    custom: CustomTable = NO_CUSTOM,
) -> Starlette:
    """The ASGI app. ``executor`` runs UpdateMachine; without one UpdateMachine answers a clear Failure.

    ``custom``: the user-defined capabilities (``--capabilities-file``), already loaded and checked.
    """
    context = HookContext(settings=settings, hooks=HOOKS, executor=executor, custom=custom)
    metrics = metrics or Metrics()
    prefix = normalize_prefix(settings.path_prefix)
    hook_paths = [prefix + hook.path for hook in HOOKS]

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> Response:
        # CanUpdate* and Discovery need nothing beyond this process; report whether updates can run
        return JSONResponse({"status": "ready", "hooks": hook_paths, "executor": executor is not None})

    # one table: a route per hook of HOOKS (as Discovery announces them), then the probes and /metrics
    routes = [
        Route(path, hook_endpoint(hook, context, metrics), methods=["POST"])
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
    return Starlette(routes=routes, middleware=middleware, exception_handlers={HTTPException: _http_error})
