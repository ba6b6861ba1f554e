"""UpdateMachine: validate, plan (pure core), hand the run to the executor, map its Progress to the answer.

The executor (``inplace_extension.runs.service.RunService``) is injected and reached only through
:class:`inplace_extension.runs.model.Runs`. Every answer is deterministic for the same desired spec
(docs/capi-hooks.md §3.2, §7.5). In the Kubernetes-aware mode, desired infrastructure tags that the
provider applies itself (``inplace.infra_tags``) are waited for beside the host steps: the answer is done
when both are, a Failure when either fails.
"""

from __future__ import annotations

import logging

from inplace_extension.api.common import ResponseStatus
from inplace_extension.api.inplace import UpdateMachineRequest, UpdateMachineResponse
from inplace_extension.errors import InvalidRequest
from inplace_extension.hooks.context import HookContext, HookOptions
from inplace_extension.inplace.custom import NO_CUSTOM, CustomTable
from inplace_extension.inplace.infra_tags import desired_tags
from inplace_extension.inplace.plan import Plan, PlanError, plan_update
from inplace_extension.runs.model import Progress, ProgressState, RunRequest, run_request

logger = logging.getLogger(__name__)

# the exact message of CAPI's reference extension (test/extension/handlers/inplaceupdate,
# docs/capi-hooks.md §8)
UNEXPECTED_CALL_MESSAGE = (
    "Unexpected call to UpdateMachine hook after CanUpdateMachine or CanUpdateMachineSet "
    "did not return any patches"
)
NO_EXECUTOR_MESSAGE = (
    "UpdateMachine: no executor configured; this extension instance answers CanUpdate* but cannot run updates"
)


def plan_request(request: UpdateMachineRequest, custom: CustomTable = NO_CUSTOM) -> Plan:
    """The plan for the desired objects; an invalid value becomes ``InvalidRequest`` naming its field path."""
    try:
        return plan_update(request.desired.to_json(), custom)
    except PlanError as exc:
        path = exc.where if exc.where.startswith("desired") else f"desired.{exc.where}"
        raise InvalidRequest(path, exc.problem) from None


def to_run_request(plan: Plan, request: UpdateMachineRequest) -> RunRequest:
    """The run of ``plan`` for the request's Machine (its annotations and labels)."""
    metadata = request.desired.machine.metadata
    return run_request(plan, metadata.annotations or {}, metadata.labels or {})


def to_response(progress: Progress, default_retry_after: int) -> UpdateMachineResponse:
    """The one mapping Progress -> answer: running = Success + retry > 0, done = retry 0, failed = Failure."""
    if progress.state is ProgressState.IN_PROGRESS:
        # never 0 while running: CAPI would read 0 as "update completed" (§6.4)
        retry = progress.retry_after_seconds if progress.retry_after_seconds > 0 else default_retry_after
        return UpdateMachineResponse(
            status=ResponseStatus.SUCCESS, message=progress.message, retry_after_seconds=max(retry, 1)
        )
    if progress.state is ProgressState.DONE:
        return UpdateMachineResponse(
            status=ResponseStatus.SUCCESS, message=progress.message, retry_after_seconds=0
        )
    return UpdateMachineResponse(
        status=ResponseStatus.FAILURE, message=progress.message, retry_after_seconds=0
    )


def combined(host: Progress | None, infrastructure: Progress | None) -> Progress:
    """One answer for the host steps and the infrastructure tags (either may be absent, not both): the
    first failure, else in progress while either is (both messages), else done."""
    parts = [p for p in (host, infrastructure) if p is not None]
    if len(parts) == 1:
        return parts[0]
    for part in parts:
        if part.state is ProgressState.FAILED:
            return part
    running = [p for p in parts if p.state is ProgressState.IN_PROGRESS]
    if running:
        retry = min((p.retry_after_seconds for p in running if p.retry_after_seconds > 0), default=0)
        return Progress(ProgressState.IN_PROGRESS, "; ".join(p.message for p in running), retry)
    return Progress(ProgressState.DONE, "; ".join(p.message for p in parts))


async def update_machine(request: UpdateMachineRequest, context: HookContext) -> UpdateMachineResponse:
    machine = request.desired.machine.key
    if HookOptions.from_settings(request.settings).disable_in_place_updates:
        logger.info("hook=UpdateMachine machine=%s decision=failure reason=disabled", machine)
        return UpdateMachineResponse(status=ResponseStatus.FAILURE, message=UNEXPECTED_CALL_MESSAGE)
    run = to_run_request(plan_request(request, context.custom), request)
    if context.runs is None:
        logger.warning(
            "hook=UpdateMachine machine=%s run=%s decision=failure reason=no-executor", machine, run.ident
        )
        return UpdateMachineResponse(status=ResponseStatus.FAILURE, message=NO_EXECUTOR_MESSAGE)
    tags = None
    if context.infra_tags is not None:
        tags = desired_tags(request.desired.to_json().get("infrastructureMachine"))
    # a desired state whose host steps hold already (none, or only the Kubernetes version the Node
    # reports) but whose tags change is only the provider's work: no play, no SSH, no inventory entry
    idle = tags is not None and context.infra_tags is not None
    idle = idle and (not run.capabilities or await context.infra_tags.host_idle(run))  # type: ignore[union-attr]
    host = None if idle else await context.runs.poll(run)
    infrastructure = (
        await context.infra_tags.poll(tags, request.desired.machine.metadata.name)
        if context.infra_tags and tags
        else None
    )
    progress = combined(host, infrastructure)
    logger.info(
        "hook=UpdateMachine machine=%s run=%s capabilities=%s decision=%s",
        machine,
        run.ident,
        ",".join(run.capabilities) or "-",
        progress.state.value,
    )
    return to_response(progress, context.settings.retry_after_seconds)
