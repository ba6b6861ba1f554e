"""The MCM agent's loop: watch the target cluster's Nodes, update the ones MCM made ready, answer.

One asyncio task per Node being worked on (a Node's watch events only wake its task). A task: take the
Node as last watched (or as our own last patch answered: the agent never GETs a Node it watches);
remove the critical-components taint once MCM finished it (flag); if MCM waits for an update
(``node_state.wants_update``), claim the Node (resourceVersion-guarded annotation: two replicas never
act on one Node), read the desired state from the control cluster (``desired``), and poll the run
service - the same executor as the CAPI UpdateMachine hook, so the same plan, fingerprint, host
resolution (the Node's annotation, labels and ``status.addresses`` in place of the Machine's), host lock
and stamp, and artifacts on disk: a restarted agent resumes without a second apply. A final answer is a
merge patch of the result label and reason annotation, and of the answered annotation naming the desired
state it is for: no replica (nor this one restarted) acts on that state again while MCM has not consumed
the result. While an update's play is in flight the Node's task waits for its end (the run service's
``wait_end``), at most ``--poll-seconds``: the answer follows the play's end, not the next tick (the
``local`` executor is woken by the end itself, the ``kubernetes`` one reads the Job once a second).
Retriable failures are answered ``failed`` and retried with backoff until they succeed or
their retry budget is spent (then the ``blocked after ...`` answer is final until the retry annotation).
A periodic resync looks again at the Nodes whose last watched state calls for the agent (claims of dead
replicas, backoffs ending, a step that failed): only those, as any change of another Node is a watch
event, so a resync of a large pool looks at the Nodes MCM is updating, not all of them.

An operator's pause annotation on the Node's MachineDeployment (read with the desired state) holds a
Node that has not started: no result, one ``InPlaceUpdateWaiting`` Event, as outside a maintenance
window. Its cancel value answers such a Node ``failed`` with the stable ``cancelled by ...`` reason, not
as a final answer: removing the annotation lets the update start at the Node's next look. A change of a
MachineDeployment wakes the held Nodes at once. A ``kubernetes`` health check past its ``timeout``
before the start is answered ``failed`` in the same way: the resync looks again, and the update starts
once the check holds.

An AWS MachineClass's tags (``aws_tags``) obey the same holds: they are applied before the play, only
once the run service says nothing keeps a new start back (``held``), and an AWS error a retry can fix
counts against the same retry budget as a play's failed attempt.

Once MCM is done with a Node (its candidate and result labels gone), the agent removes the annotations
of ours left on it (``node_state.leftovers``).

The agent owns the two cluster clients it is given: when :meth:`Agent.run` ends (cancelled) it lets
each Node task finish the step it is in, then closes both clients. A request cancelled while its
connection is being set up would leave that socket open (the HTTP library closes it on errors, not on
cancellation).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from inplace_extension.aws.ec2_tags import Credentials, Ec2TagsError, apply_tags
from inplace_extension.inplace.custom import NO_CUSTOM, CustomTable
from inplace_extension.kube.errors import Conflict
from inplace_extension.kube.events import node_event
from inplace_extension.kube.port import ControlCluster, TargetCluster
from inplace_extension.mcm import aws_tags
from inplace_extension.mcm import node_state as ns
from inplace_extension.mcm.desired import DesiredStateError
from inplace_extension.mcm.metrics import AgentMetrics
from inplace_extension.mcm.source import DesiredStates
from inplace_extension.runs.model import EndWaitingRuns, Progress, ProgressState, RunRequest, run_request
from inplace_extension.runs.policy import BLOCKED_MESSAGE, RETRY_ANNOTATION

log = logging.getLogger(__name__)

COMPONENT = "inplace-extension-mcm-agent"
# How long a stopping agent waits for its Node tasks to finish their step: longer than the client's
# connect timeout (lightkube's default, 10 s), so a request still connecting ends on its own, socket closed
STOP_GRACE_SECONDS = 15.0


@dataclass(frozen=True)
class AgentOptions:
    namespace: str  # MCM's namespace in the control cluster
    delete_pods: bool = False  # delete the Pods left on a Node after a successful update (GNA does)
    remove_critical_taint: bool = True
    poll_seconds: float = 2.0  # how often a running update is polled
    resync_seconds: float = 30.0
    claim_seconds: float = 120.0
    agent_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    # the retry budget of an AWS tags application, as a play's (--max-failed-attempts)
    max_failed_attempts: int = 3


class Agent:
    def __init__(
        self,
        options: AgentOptions,
        target: TargetCluster,
        control: ControlCluster,
        runs: EndWaitingRuns,
        metrics: AgentMetrics,
        custom: CustomTable = NO_CUSTOM,
    ) -> None:
        self.options = options
        self._target = target
        self._control = control
        self._desired = DesiredStates(control, options.namespace, custom, self._deployment_changed)
        self._runs = runs
        self._metrics = metrics
        self._custom = custom
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._wake: dict[str, asyncio.Event] = {}
        self._active: set[str] = set()  # Nodes whose last watched state calls for us (resynced)
        self._waiting: dict[str, Progress] = {}  # Node -> what its update waits for (an Event once)
        self._in_flight: dict[str, RunRequest] = {}  # Node -> its update whose play is in flight
        self._cancelled: set[str] = set()  # Nodes answered "cancelled by ..." (looked at again on a change)
        # Node -> the Node as last watched, or as our last patch of it answered (newer until its watch event)
        self._nodes: dict[str, dict[str, Any]] = {}
        self.connected = asyncio.Event()
        self._stopping = False

    async def run(self) -> None:
        """Watch and resync until cancelled; then stop, and close both clients."""
        resync = asyncio.create_task(self._resync())
        desired = asyncio.create_task(self._desired.run(), name="desired state watch")
        try:
            async for name, node in self._target.watch_nodes(self.connected):
                if node is None:  # gone: a task working on it ends at its next step
                    self._nodes.pop(name, None)
                    self._active.discard(name)
                    if name in self._tasks and not self._tasks[name].done():
                        self.kick(name)
                    continue
                self._nodes[name] = node
                if ns.wants_update(node) or ns.has_critical_taint(node) or ns.leftovers(node):
                    self._active.add(name)
                    self.kick(name)
                else:  # nothing for us until it changes, and a change is a watch event
                    self._active.discard(name)
        finally:
            await self._stop(resync, desired)

    async def _stop(self, *watchers: asyncio.Task[None]) -> None:
        """The watches end at once; each Node task ends after the step it is in (cancelled after
        :data:`STOP_GRACE_SECONDS`), so no request is cut while it connects; then the clients close."""
        self._stopping = True
        for watcher in watchers:
            watcher.cancel()
        for wake in self._wake.values():
            wake.set()
        tasks = [task for task in self._tasks.values() if not task.done()]
        if tasks:
            _, late = await asyncio.wait(tasks, timeout=STOP_GRACE_SECONDS)
            for task in late:
                task.cancel()
        await asyncio.gather(*watchers, *tasks, return_exceptions=True)
        await self._target.close()
        await self._control.close()

    def kick(self, name: str) -> None:
        """Wake the Node's task, or start one (none once the agent stops)."""
        if self._stopping:
            return
        if name in self._tasks and not self._tasks[name].done():
            self._wake[name].set()
            return
        self._wake[name] = asyncio.Event()
        self._tasks[name] = asyncio.create_task(self._work(name), name=f"node {name}")

    def _deployment_changed(self) -> None:
        """A MachineDeployment changed (a pause set or removed, or only its status): the held Nodes look
        again now rather than at their next resync."""
        for name in [*self._waiting, *self._cancelled]:
            self.kick(name)

    async def _resync(self) -> None:
        while True:
            await asyncio.sleep(self.options.resync_seconds)
            for name in list(self._active):
                self.kick(name)

    async def _work(self, name: str) -> None:
        try:
            wake = self._wake[name]
            while not self._stopping:
                # cleared before the step, not after: a wake during the step (the watch event of a write
                # that made the step's patch a Conflict, the kubelet's after its restart) makes the wait
                # below return at once instead of sleeping the full tick
                wake.clear()
                if not await self._step(name) or self._stopping:  # the agent began to stop during the step
                    break
                # a Node waiting for its maintenance window is looked at again when the run service says
                # (or on a change of the Node), not every poll_seconds
                waiting = self._waiting.get(name)
                delay = self.options.poll_seconds
                if waiting is not None:
                    delay = min(float(waiting.retry_after_seconds), self.options.resync_seconds)
                flight = self._in_flight.get(name)
                if flight is not None:  # poll again as its play ends, not at the next tick
                    await self._until_end(flight, wake, delay)
                else:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(wake.wait(), delay)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("node %s: step failed; the next event or resync tries again", name)
        finally:
            self._metrics.set_updating(name, False)
            self._waiting.pop(name, None)
            self._in_flight.pop(name, None)

    async def _until_end(self, request: RunRequest, wake: asyncio.Event, seconds: float) -> None:
        """Until the play of ``request`` in flight ends, the Node's task is woken, or ``seconds`` pass."""
        deadline = asyncio.get_running_loop().time() + seconds
        end = asyncio.create_task(self._runs.wait_end(request, seconds))
        woken = asyncio.create_task(wake.wait())
        try:
            await asyncio.wait({end, woken}, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
            if end.done() and not woken.done() and (end.exception() is not None or not end.result()):
                # the executor could not wait (it logged why): sleep out the tick, or a wake, as before
                left = deadline - asyncio.get_running_loop().time()
                await asyncio.wait({woken}, timeout=max(0.0, left))
        finally:
            for task in (end, woken):
                task.cancel()
            await asyncio.gather(end, woken, return_exceptions=True)

    async def _step(self, name: str) -> bool:
        """One look at the Node; True while there is more to do for it."""
        self._in_flight.pop(name, None)
        try:
            node = self._nodes.get(name)
            if node is None:
                self._active.discard(name)
                self._cancelled.discard(name)
                return False
            if self.options.remove_critical_taint and ns.wants_taint_removal(node):
                if await self._target.remove_taint(node, *ns.CRITICAL_TAINT):
                    log.info("node %s: removed taint %s", name, ns.CRITICAL_TAINT[0])
                    self._metrics.taint_removed()
                return True
            if not ns.wants_update(node):
                self._cancelled.discard(name)
                leftovers = ns.leftovers(node)
                if leftovers:  # MCM is done with the Node: remove what is left of ours
                    self._patched(
                        await self._target.patch_node_metadata(
                            name, ns.resource_version(node), annotations=dict.fromkeys(leftovers)
                        )
                    )
                    log.info("node %s: removed %s", name, ", ".join(leftovers))
                return False
            if not ns.claimable(node, self.options.agent_id):
                return False  # another replica works on it; the resync looks again
            return await self._update(node)
        except Conflict:
            log.debug("node %s: changed under us; read again", name)
            return True  # the Node changed under us: read it again

    async def _claim(self, node: Mapping[str, Any]) -> dict[str, Any]:
        claim = ns.claim_of(node)
        remaining = claim.expires - time.time() if claim and claim.holder == self.options.agent_id else 0.0
        if remaining > self.options.claim_seconds / 2:
            return dict(node)
        value = ns.claim_value(self.options.agent_id, self.options.claim_seconds)
        return self._patched(
            await self._target.patch_node_metadata(
                ns.name(node),
                ns.resource_version(node),
                annotations={ns.CLAIM_ANNOTATION: value},
            )
        )

    def _patched(self, node: dict[str, Any]) -> dict[str, Any]:
        """Our patch's answer is the Node as it is now: the next step works on it, not on the copy the
        watch has not replaced yet (whose resourceVersion would only earn a Conflict)."""
        if ns.name(node) in self._nodes:  # not one the watch has reported gone meanwhile
            self._nodes[ns.name(node)] = node
        return node

    async def _update(self, node: dict[str, Any]) -> bool:
        """Resolve the desired state (reads only), then claim and poll unless this exact state (and retry
        token) was answered finally already, by this replica or another: a second run would apply a
        failed task again, and every patch is a watch event that would wake the replicas again."""
        name = ns.name(node)
        token = ns.node_annotations(node).get(RETRY_ANNOTATION, "")
        try:
            desired = await self._desired.desired_for(node)
        except DesiredStateError as exc:  # the control cluster's own errors: logged, tried again
            key = f"{exc}|{token}"
            if not ns.answered(node, key):
                await self._answer(node, successful=False, reason=str(exc), answered_key=key)
            return False
        # an AWS MachineClass's tags are part of the desired state: a tags-only change is a new one
        tags = "" if desired.tags is None else f"+tags:{desired.tags.digest}"
        key = f"{desired.plan.fingerprint}{tags}|{token}"
        if ns.answered(node, key):  # MCM has not consumed it yet, or it waits for the retry annotation
            result = ns.node_labels(node).get(ns.RESULT_LABEL)
            log.debug("node %s: answered %s already for this desired state", name, result)
            return False
        node = await self._claim(node)
        request = run_request(
            desired.plan,
            ns.node_annotations(node),
            ns.node_labels(node),
            desired.hold,
            ns.node_addresses(node),
        )
        wanted = desired.tags
        held: Progress | None = None
        if wanted is not None and aws_tags.last_applied(ns.node_annotations(node)) != dict(wanted.tags):
            # the tags obey every hold as a play does: applied before the play, once no cancel, pause,
            # closed window or health check keeps a new start back (else answered as the poll would)
            held = await self._runs.held(request)
            if held is None:
                failed = await self._apply_tags(node, wanted, key)
                node = self._nodes.get(name, node)
                if failed is not None:
                    reason, final = failed
                    if not final:  # an outage or throttling: answered failed, retried at the next poll
                        await self._answer(node, successful=False, reason=reason)
                        return True
                    await self._answer(node, successful=False, reason=reason, answered_key=key)
                    return False
        progress = held or await self._runs.poll(request)
        if progress.unavailable:
            # the API server away or busy: nothing was decided; no Event, no result, the resync asks again
            log.info("node %s: %s", name, progress.message)
            return True
        self._cancelled.discard(name)
        if progress.waiting is not None and progress.state is ProgressState.IN_PROGRESS:
            # not started (outside its maintenance window, paused): no result, MCM keeps the Node waiting
            before = self._waiting.get(name)
            self._waiting[name] = progress
            if before is None or before.message != progress.message:
                log.info("node %s: %s", name, progress.message)
                await self._target.post_event(
                    node_event(node, "InPlaceUpdateWaiting", progress.message, COMPONENT)
                )
            else:
                log.debug("node %s: still %s", name, progress.message)
            return True
        self._waiting.pop(name, None)
        if progress.cancelled:
            # not final: the Node keeps this failed result while the annotation says cancel; once it is
            # removed, the Node's next look starts the update (and a successful result lets MCM go on)
            self._cancelled.add(name)
            await self._answer(node, successful=False, reason=progress.message)
            return False
        if progress.state is ProgressState.FAILED and progress.transient:
            # not final either (a health check past its timeout before the start): the Node keeps the
            # failed result while the check does not hold; the resync looks again, and once it holds
            # the update starts (and a successful result lets MCM go on)
            await self._answer(node, successful=False, reason=progress.message)
            return False
        if progress.state is ProgressState.IN_PROGRESS:
            if progress.in_flight:
                self._in_flight[name] = request
            if not self._metrics.is_updating(name):
                self._metrics.set_updating(name, True)
                await self._target.post_event(
                    node_event(node, "InPlaceUpdateStarted", f"run {request.ident}", COMPONENT)
                )
            if progress.retrying:
                await self._answer(node, successful=False, reason=progress.message)
            return True
        successful = progress.state is ProgressState.DONE
        await self._answer(node, successful, progress.message, answered_key=key)
        return False

    async def _apply_tags(
        self, node: dict[str, Any], target: aws_tags.TagsTarget, key: str
    ) -> tuple[str, bool] | None:
        """Set the MachineClass's tags on the Node's instance (mcm/aws_tags.py, aws/ec2_tags.py) unless
        the Node's record says they are applied; then record them. None when done, else the reason and
        whether it is final. A retriable error counts against the retry budget (``--max-failed-attempts``)
        of the desired state ``key``, as a play's failed attempt does, on the Node (a restarted agent
        goes on counting): the one that spends it is final. The credentials are read here and handed to
        boto3 only."""
        name = ns.name(node)
        record = aws_tags.last_applied(ns.node_annotations(node))
        if record == dict(target.tags):
            return None
        try:
            secret = await self._control.get("Secret", target.secret_namespace, target.secret_name)
            key_id, key_secret = aws_tags.credentials_of(secret, target)
        except DesiredStateError as exc:
            return str(exc), True
        try:
            applied = await asyncio.to_thread(
                apply_tags,
                Credentials(key_id, key_secret),
                target.region,
                target.instance_id,
                target.tags,
                record,
            )
        except Ec2TagsError as exc:
            log.info("node %s: tags of %s: %s", name, target.instance_id, exc)
            if not exc.retriable:
                return f"AwsTagsFailed: {exc}", True
            failures = aws_tags.failures(ns.node_annotations(node), key) + 1
            # at any version of the Node: the AWS call took long (its retries in an outage) and the Node
            # has changed meanwhile (MCM, the kubelet); a Conflict here lost the count and the answer on
            # every try, and the Node waited without a word for the whole outage
            self._patched(
                await self._target.patch_node_metadata(
                    name,
                    None,
                    annotations={aws_tags.FAILURES_ANNOTATION: aws_tags.failures_value(key, failures)},
                )
            )
            if failures >= self.options.max_failed_attempts:
                return BLOCKED_MESSAGE.format(count=failures, reason=f"AwsTagsRetriable: {exc}"), True
            return f"AwsTagsRetriable: {exc}", False
        self._patched(  # at any version too: the tags are on the instance whatever changed on the Node
            await self._target.patch_node_metadata(
                name,
                None,
                annotations={
                    aws_tags.LAST_APPLIED_ANNOTATION: aws_tags.record_value(target.tags),
                    aws_tags.FAILURES_ANNOTATION: None,
                },
            )
        )
        created, deleted = len(applied.created), len(applied.deleted)
        message = f"tags of instance {target.instance_id}: {created} set, {deleted} removed"
        log.info("node %s: %s", name, message)
        await self._target.post_event(node_event(node, "InPlaceTagsApplied", message, COMPONENT))
        return None

    async def _answer(
        self, node: dict[str, Any], successful: bool, reason: str = "", answered_key: str | None = None
    ) -> None:
        """``answered_key``: a final answer for that desired state (releases the claim); without it a
        retriable failure that keeps the claim while we retry."""
        name = ns.name(node)
        final = answered_key is not None
        reason = "" if successful else reason
        if successful and self.options.delete_pods:
            deleted = await self._target.delete_pods_on_node(name, frozenset({"DaemonSet", "Node"}))
            log.info("node %s: deleted %d pods left on it", name, deleted)
        if not ns.result_written(node, successful, reason, release=final, answered_key=answered_key):
            labels, annotations = ns.result_metadata(successful, reason, final, answered_key)
            self._patched(
                await self._target.patch_node_metadata(
                    name, ns.resource_version(node), labels=labels, annotations=annotations
                )
            )
            log.info("node %s: update-result=%s %s", name, labels[ns.RESULT_LABEL], reason)
            self._metrics.result(ns.SUCCESSFUL if successful else ns.FAILED)
            event = "InPlaceUpdateSucceeded" if successful else "InPlaceUpdateFailed"
            message = reason or "update applied"
            await self._target.post_event(node_event(node, event, message, COMPONENT, warning=not successful))
        if final:
            self._metrics.set_updating(name, False)
