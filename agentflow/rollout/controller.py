"""The rollout controller: new planner versions in, canaries driven on a backend, decisions out.

It reads ``planner.versions`` and ``trajectories`` (``handle`` is the worker's handler) and is ticked every few
seconds (timeouts, the backend's health, retries). Per version:

    planner.versions --> load on the backend at ladder[0] % ------------------------> "canary"
    trajectories     --> per-arm statistics --> policy.decide --+--> next step < 100 % --> "step"
                                                                +--> 100 %, now stable --> "promote"
                                                                +--> back to stable -----> "rollback"
    a bad event, a checkpoint that fails to load or a revision that fails -------------> "reject"
    a newer version arrived while this one waited ------------------------------------> "skip"
    undecided for supersede_s (and supersede_min_rewarded) while a newer one waits ---> "rollback" (superseded)

Each decision is a ``RolloutDecision`` event (given to ``sink``, keyed ``rollout:<version>``), one JSON log line
and Prometheus metrics. Backend operations happen *before* their decision is announced; one that fails with a
retryable error is retried on the next ticks (the traffic stays as it was meanwhile), one that fails for good
(checkpoint refused, unknown version) is announced as a reject or a rollback. One version is canaried at a time;
while one is, the newest waiting version is kept and older waiting ones are skipped.

The controller also owns the deployment's routing table (``planner.routing``, given to ``routes``): where each live
version is served (``Backend.endpoint``) and its weight; callers follow it and keep every trajectory on one version
(``agentflow.llm.routing``). The table is derived from the state — the stable version, the canary at its step once
the backend says it is ready, the latest published version — and re-published whenever it changes. It routes to a
version only after it is loaded. A version withdrawn by a promotion (the old stable) or a rollback (the canary)
stays in the table with weight 0 for ``drain_s``: no new trajectory starts on it, and the trajectories already on it
finish on it (none mixes versions). Then the backend retires it (``Backend.retire``: unloads it, deletes its
InferenceService) and the table drops it.

Trajectories count only while a canary runs, only those started after it began, once per trajectory id, for the
arm whose name every planner call of the trajectory reports (``records.observe``). The same trajectories feed the
tripwires (``tripwires.features``); one that fires rolls the canary back with a reason naming it and its numbers
(``policy.decide``), which also quarantines the version's training groups in the trainer.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from agentflow.bus import codec
from agentflow.errors import InvalidInput
from agentflow.proto.v1 import events_pb2 as pb
from agentflow.llm.routing import RoutingTable, check_table, routing_key
from agentflow.rollout import policy as pol
from agentflow.rollout import tables
from agentflow.rollout import tripwires as tw
from agentflow.rollout.backends import Backend, BackendError, Endpoint, Version
from agentflow.rollout.fleet import RolloutFleet
from agentflow.rollout.metrics import RolloutMetrics, rollout_metrics
from agentflow.rollout.records import ATTRIBUTED, observe
from agentflow.rollout.settings import RolloutSettings
from agentflow.versions import check_version_name, parse_version

log = logging.getLogger("agentflow.rollout")

_REMEMBERED_TRAJECTORIES = 200_000  # ids kept for de-duplication
_REMEMBERED_VERSIONS = 10_000
#: Actions after which a version is done with (a redelivered event for it is ignored).
FINAL_ACTIONS = ("promote", "rollback", "reject", "skip")


@dataclass
class Rollout:
    """The canary in progress."""

    canary: Version
    stable: Version
    step: int  # index into the ladder
    started_at: float  # wall clock (trajectories started earlier are not counted)
    step_started_at: float
    arms: pol.Arms
    trips: tw.Tripwires = field(default_factory=tw.Tripwires)
    step_base: int = 0  # canary samples when the step began
    #: Whether the backend says the canary can take traffic (the routing table names it only then).
    ready: bool = False
    #: A decided action whose backend call failed with a retryable error: (action, reason, evidence).
    pending: tuple[str, str, tuple] | None = None


class RolloutController:
    def __init__(self, settings: RolloutSettings, backend: Backend, *, sink: Callable[[pb.Envelope], None],
                 clock: Callable[[], float] = time.time, metrics: RolloutMetrics | None = None,
                 stable: Version | None = None, routes: Callable[[pb.Envelope], None] | None = None,
                 fleet: RolloutFleet | None = None):
        self.settings = settings
        self.policy = settings.policy()
        self.backend = backend
        self.sink = sink
        self.clock = clock
        self.metrics = metrics or rollout_metrics()
        self.stable = stable
        self.rollout: Rollout | None = None
        self.waiting: pb.PlannerVersion | None = None  # the newest version not started yet
        self._decided: OrderedDict[str, None] = OrderedDict()  # versions done with (promoted, rolled back, ...)
        self._seq: OrderedDict[str, int] = OrderedDict()  # version -> its next decision's number (envelope step)
        #: trajectory id -> (the rollout it counted for, by start time; its arm; whether its reward counted; whether
        #: its judge-and-rule pair counted for the tripwires)
        self._seen: OrderedDict[str, tuple] = OrderedDict()
        #: a rollback left backend state to settle once the restored version is ready (KServe: canaryTrafficPercent 0)
        self._untidy = False
        self.routes = routes  # where routing tables go (None: not published)
        #: where calls pinned to a version without a route go (local: the one server, which loads every version)
        self.pin_endpoint = settings.pin_endpoint or (settings.callers_url if settings.backend == "local" else "")
        self.latest = ""  # the most recently published version (what a "latest" pin names)
        self._latest_before = ""  # the one before it (back in force if the latest is rejected)
        self.routing: RoutingTable | None = None  # the table last published
        #: withdrawn versions still routed (weight 0) for the trajectories on them: name -> (version, retire at)
        self.retiring: OrderedDict[str, tuple[Version, float]] = OrderedDict()
        self._unrouted: dict[str, Version] = {}  # drained and out of the table: the backend retires them
        self.fleet = fleet  # the newest versions for pinned calls (rollouts), apart from production
        self._lock = threading.RLock()

    # --- inputs ------------------------------------------------------------------------------------------------------

    def handle(self, envelope: pb.Envelope) -> list:
        """The worker's handler: decisions go to ``sink`` (published before the offsets are committed)."""
        kind = envelope.WhichOneof("payload")
        if kind == "planner_version":
            self.on_version(envelope.planner_version)
        elif kind == "trajectory":
            from agentflow.domain.convert import record_from_proto

            self.on_trajectory(record_from_proto(envelope.trajectory))
        return []

    def on_version(self, version: pb.PlannerVersion) -> None:
        with self._lock:
            name = version.version.strip()
            if not name or not version.checkpoint_uri.strip():
                self._announce_reject(version, "a planner version needs a version name and a checkpoint_uri")
                return
            try:
                check_version_name(name)  # before it can become "latest" in a routing table
            except InvalidInput as e:
                self._announce_reject(version, str(e))
                return
            if self.fleet is not None:
                self.fleet.publish(Version(name, version.checkpoint_uri), version.created_at_unix_ms / 1000
                                   or self.clock())
                self.fleet.sync(force=True)
                self.metrics.fleet_versions.set(len(self.fleet.versions))
            if (parse_version(name) or -1) >= (parse_version(self.latest) or -1):
                self._latest_before, self.latest = self.latest, name
                self._sync_routes(f"{name} published")
            if self._known(name):
                log.info("planner version %s seen again; already handled", name)
                return
            if self.rollout is not None or self.waiting is not None:
                self._wait(version)
                return
            self._start(version)

    def on_trajectory(self, record: dict) -> None:
        """Count a finished production trajectory for its arm (training rollouts and evaluations are pinned to a
        version and sampled differently: they are not the traffic a canary is judged on). The memory service emits
        a record again when feedback joins it later: that copy adds its reward if the first had none (and nothing
        else)."""
        if record.get("source") in ("training", "eval"):
            self.metrics.trajectories.labels("not_traffic").inc()
            return
        with self._lock:
            obs = observe(record, self.settings.reward_source)
            rollout = self.rollout
            if obs.trajectory_id in self._seen:
                started_at, index, rewarded, paired = self._seen[obs.trajectory_id]
                counted = rollout is not None and started_at == rollout.started_at and index is not None
                late = False
                if counted and not rewarded and obs.reward is not None:
                    rollout.arms.add_reward(index, obs.reward)
                    rewarded = late = True
                if counted and not paired and (disagree := tw.judge_rule_disagreement(record)) is not None:
                    rollout.trips.add_pair(index, disagree)
                    paired = late = True
                if late:
                    self._seen[obs.trajectory_id] = (started_at, index, rewarded, paired)
                    self.metrics.trajectories.labels("late_reward").inc()
                    self._evaluate()
                else:
                    self.metrics.trajectories.labels("duplicate").inc()
                return
            if obs.trajectory_id:
                self._seen[obs.trajectory_id] = (None, None, False, False)
                if len(self._seen) > _REMEMBERED_TRAJECTORIES:
                    self._seen.popitem(last=False)
            if rollout is None:
                self.metrics.trajectories.labels("idle").inc()
                return
            if obs.attribution != ATTRIBUTED:
                self.metrics.trajectories.labels(obs.attribution).inc()
                return
            if obs.started_at_unix and obs.started_at_unix < rollout.started_at:
                self.metrics.trajectories.labels("early").inc()
                return
            if obs.version == rollout.canary.name:
                arm, index = "canary", pol.CANARY
            elif obs.version == rollout.stable.name:
                arm, index = "stable", pol.STABLE
            else:
                self.metrics.trajectories.labels("other").inc()
                return
            self.metrics.trajectories.labels(arm).inc()
            rollout.arms.add(index, obs.reward, obs.error_rate, min(1.0, obs.latency_s / self.policy.latency_cap_s))
            features = tw.features(record)
            rollout.trips.add(index, features)
            if obs.trajectory_id:
                self._seen[obs.trajectory_id] = (rollout.started_at, index, obs.reward is not None,
                                                 features.disagree is not None)
            self._evaluate()

    def tick(self) -> None:
        """Timeouts, the canary's health on the backend, retries of failed backend calls, waiting versions, what
        the backend left to settle (``tidy``), and the routing table."""
        with self._lock:
            rollout = self.rollout
            if rollout is not None:
                if rollout.pending is not None:
                    self._apply(*rollout.pending)
                    return
                if self._check_backend(rollout):
                    self._evaluate()
            elif self.waiting is not None:
                version, self.waiting = self.waiting, None
                self._start(version, queued=True)
            elif self._untidy and self.stable is not None:
                try:
                    self._untidy = not self.backend.tidy(self.stable)
                except BackendError as e:
                    self._backend_failed("tidy", e)
            self._retire_drained()
            self._renew_routes()
            if self.fleet is not None and self.fleet.sync():
                self.metrics.fleet_versions.set(len(self.fleet.versions))
                self._sync_routes("rollout fleet: " + (", ".join(self.fleet.versions) or "empty"))

    def resume(self, decisions: Iterable[tuple[int, pb.RolloutDecision]]) -> None:
        """Carry on after a restart from the decisions this controller announced before (oldest first): versions
        already decided are not started again, a queued version is queued again, and a canary in progress continues
        at its step with fresh statistics and a fresh step clock (evidence from before the restart is not reused)."""
        with self._lock:
            current: pb.RolloutDecision | None = None
            queued: pb.RolloutDecision | None = None
            stable: Version | None = None
            withdrawn: Version | None = None  # by the last promotion or rollback: retired again, it may not have been
            for seq, d in decisions:
                self._count(d.version, seq + 1)
                if d.action in FINAL_ACTIONS:
                    self._remember(d.version)
                if d.action == "promote" and d.stable_version and d.stable_uri:
                    withdrawn = Version(d.stable_version, d.stable_uri)
                elif d.action in ("rollback", "reject") and d.checkpoint_uri:
                    withdrawn = Version(d.version, d.checkpoint_uri)
                if d.action in ("canary", "step"):
                    current = d
                elif current is not None and d.version == current.version and d.action in ("promote", "rollback",
                                                                                             "reject"):
                    stable = Version(d.version, d.checkpoint_uri) if d.action == "promote" else \
                        Version(d.stable_version, d.stable_uri)
                    current = None
                elif d.action == "promote":
                    stable = Version(d.version, d.checkpoint_uri)
                elif stable is None and d.stable_version and d.stable_uri:
                    stable = Version(d.stable_version, d.stable_uri)
                if d.action == "queue":
                    queued = d
                elif queued is not None and d.version == queued.version:
                    queued = None
            if current is not None and current.stable_version and current.stable_uri:
                canary, stable = (Version(current.version, current.checkpoint_uri),
                                  Version(current.stable_version, current.stable_uri))
                ladder = self.policy.ladder
                step = max([i for i, p in enumerate(ladder) if p <= current.percent] or [0])
                self.rollout = self._new_rollout(canary, stable, step)
                log.info("resuming the canary of %s at %d%% (stable %s)", canary.name, ladder[step], stable.name)
            self.stable = stable
            if queued is not None:
                self.waiting = pb.PlannerVersion(version=queued.version, checkpoint_uri=queued.checkpoint_uri)
                log.info("planner version %s is queued again", queued.version)
            self.latest = max([self.latest, *(d.version for _, d in decisions)], key=lambda v: parse_version(v) or -1)
            live = {v.name for v in (stable, self.rollout and self.rollout.canary) if v}
            if withdrawn is not None and withdrawn.name not in live:
                self.retiring[withdrawn.name] = (withdrawn, self.clock() + self.settings.drain_s)
            self._untidy = hasattr(self.backend, "tidy")  # whatever a restart interrupted is settled on idle ticks
            self._gauges()

    # --- steps ------------------------------------------------------------------------------------------------------

    def _start(self, version: pb.PlannerVersion, *, queued: bool = False) -> None:
        """Load ``version`` as the canary. ``queued``: it was announced as queued before (no second announcement
        when it has to wait again)."""
        try:
            stable = self._stable()
        except BackendError as e:
            self._backend_failed("status", e)
            if e.retryable:
                self._defer(version, e, queued)
            else:
                self._announce_reject(version, f"no stable version to compare with: {e}")
            return
        canary = Version(version.version.strip(), version.checkpoint_uri.strip())
        if canary.name == stable.name:
            log.info("planner version %s is already the stable version", canary.name)
            self._remember(canary.name)
            return
        percent = self.policy.ladder[0]
        try:
            self.backend.load_canary(canary, stable, percent)
        except (BackendError, InvalidInput) as e:
            self._backend_failed("load", e)
            if getattr(e, "retryable", False):
                self._defer(version, e, queued)
                return
            self._announce_reject(version, f"could not load it: {e}", stable)
            return
        self.rollout = self._new_rollout(canary, stable, 0)
        self.rollout.ready = self._canary_ready()
        try:
            self._sync_routes(f"canary {canary.name} at {percent}%")
            self._announce("canary", f"loaded from {canary.uri}; {percent}% of the traffic", ())
        except Exception:
            self.rollout = None  # not announced: a redelivered event loads it again (idempotent) and announces
            raise

    def _evaluate(self) -> None:
        rollout = self.rollout
        if rollout is None or rollout.pending is not None:
            return
        now = self.clock()
        decision = pol.decide(rollout.arms, self.policy,
                              step_samples=int(rollout.arms.samples(pol.CANARY)) - rollout.step_base,
                              step_elapsed_s=now - rollout.step_started_at, trips=rollout.trips)
        self._gauges(decision.comparisons)
        if decision.action != "hold":
            self._apply(decision.action, decision.reason, decision.comparisons)
        elif self.waiting is not None and self._may_supersede(rollout, now):
            self._apply("rollback", f"superseded by {self.waiting.version}: undecided after "
                                    f"{now - rollout.step_started_at:.0f} s and "
                                    f"{int(rollout.arms.rewarded(pol.CANARY))} rewarded trajectories (supersede_s "
                                    f"{self.settings.supersede_s:g})", decision.comparisons)

    def _may_supersede(self, rollout, now: float) -> bool:
        """Whether an undecided canary has had its time in this step and its evidence (supersede_min_rewarded)."""
        settings = self.settings
        return (0 < settings.supersede_s <= now - rollout.step_started_at
                and rollout.arms.rewarded(pol.CANARY) >= settings.supersede_min_rewarded)

    def _apply(self, action: str, reason: str, evidence: tuple) -> None:
        """Carry out a decided action on the backend, then announce it; on a retryable failure keep it pending."""
        rollout = self.rollout
        assert rollout is not None
        rollout.pending = None
        ladder = self.policy.ladder
        try:
            if action == "rollback" or action == "reject":
                self._sync_routes(f"{action} {rollout.canary.name}",
                                  serving=self._with_retiring({rollout.stable: 100, rollout.canary: 0}))
                self.backend.rollback(rollout.canary, rollout.stable)
                self._finish(action, reason, evidence, stable=rollout.stable)
            elif ladder[rollout.step + 1] == 100:
                self._sync_routes(f"promote {rollout.canary.name}",
                                  serving=self._with_retiring({rollout.canary: 100, rollout.stable: 0}))
                self.backend.promote(rollout.canary, rollout.stable)
                self._finish("promote", reason, evidence, stable=rollout.canary)
            else:
                percent = ladder[rollout.step + 1]
                self.backend.set_percent(rollout.canary, rollout.stable, percent)
                before = rollout.step, rollout.step_started_at, rollout.step_base
                rollout.step += 1
                rollout.step_started_at = self.clock()
                rollout.step_base = int(rollout.arms.samples(pol.CANARY))
                try:
                    self._sync_routes(f"canary {rollout.canary.name} at {percent}%")
                    self._announce("step", f"{reason}; {percent}% of the traffic", evidence)
                except Exception:
                    rollout.step, rollout.step_started_at, rollout.step_base = before  # decided again, announced then
                    raise
        except (BackendError, InvalidInput) as e:
            self._backend_failed(action, e)
            if getattr(e, "retryable", False):
                rollout.pending = (action, reason, evidence)  # the traffic is unchanged; retried on the next tick
            elif action in ("rollback", "reject"):
                rollout.pending = (action, reason, evidence)  # a rollback is never abandoned
                log.error("rollback of %s failed and will be retried: %s", rollout.canary.name, e)
            else:
                self._apply("rollback", f"could not {action}: {e}", evidence)

    def _finish(self, action: str, reason: str, evidence: tuple, *, stable: Version) -> None:
        rollout = self.rollout
        canary = rollout.canary.name
        self._announce(action, reason, evidence)
        self.stable = stable
        self.rollout = None
        withdrawn = rollout.stable if stable == rollout.canary else rollout.canary
        self.retiring[withdrawn.name] = (withdrawn, self.clock() + self.settings.drain_s)
        self._untidy = hasattr(self.backend, "tidy")  # KServe: settle after a rollback, or a promotion (pair mode)
        self._sync_routes(f"{action} {canary}")
        self._gauges()
        if self.waiting is not None:
            version, self.waiting = self.waiting, None
            self._start(version, queued=True)

    def _check_backend(self, rollout: Rollout) -> bool:
        """False when the canary was ended here (failed to load, vanished, never became ready)."""
        try:
            status = self.backend.status()
        except BackendError as e:
            self._backend_failed("status", e)
            return True
        if status.canary_failure:
            self._apply("reject", f"the canary cannot serve: {status.canary_failure}", ())
            return False
        if status.weight(rollout.canary.name) is None:
            self._apply("rollback", f"{self.backend.target} no longer serves {rollout.canary.name}", ())
            return False
        rollout.ready = status.canary_ready
        if not status.canary_ready and self.clock() - rollout.started_at > self.settings.load_timeout_s:
            self._apply("reject", f"not ready {self.settings.load_timeout_s:g} s after loading", ())
            return False
        return True

    # --- the routing table ---------------------------------------------------------------------------------------------

    def _sync_routes(self, reason: str, serving: dict[Version, int] | None = None) -> None:
        """Publish the routing table when it differs from the last one published: ``serving`` ({version: weight},
        the canary first, then the stable, then the draining ones) or what the state says. A version whose endpoint
        the backend cannot tell yet is left out and its share goes to the anchor (``tables.anchor``); without the
        anchor's endpoint nothing is published. The next tick tries again."""
        if self.routes is None:
            return
        serving = serving or self._serving()
        if not serving:
            return
        rollout = self.rollout
        stable = rollout.stable if rollout else self.stable
        heaviest = tables.anchor(serving, stable)
        endpoints = self._endpoints([heaviest, *(v for v in serving if v != heaviest)])
        if heaviest not in endpoints:
            return  # keep the table in force
        context = tables.TableContext(
            self.settings.deployment, stable.name if stable else "",
            rollout.canary.name if rollout and rollout.ready else "", self.latest, self.pin_endpoint,
            self.fleet.endpoint if self.fleet and self.fleet.versions else "",
            self.fleet.versions if self.fleet else (), self.fleet.model if self.fleet else "",
            self.settings.routing_ttl_s)
        table = tables.build_table(serving, endpoints, context, anchor_version=heaviest, reason=reason,
                                   now_ms=codec.now_ms())
        try:
            check_table(table)  # never publish what callers would reject
        except InvalidInput as e:
            self._backend_failed("endpoint", e)
            return
        if tables.changes_routing(self.routing, table):
            self._publish_table(table)
            log.info(json.dumps({"event": "routing", "deployment": table.deployment, "reason": reason,
                                 "routes": {r.version: r.weight for r in table.routes}}, sort_keys=True))

    def _endpoints(self, versions: list[Version]) -> dict[Version, Endpoint]:
        """Where each of ``versions`` is served, as far as the backend can tell; none once the first is unknown."""
        found = {}
        for version in versions:
            try:
                found[version] = self.backend.endpoint(version)
            except BackendError as e:
                self._backend_failed("endpoint", e)
                if not found:
                    break
        return found

    def _renew_routes(self) -> None:
        """Publish the table in force again, with a new expiry, once a third of its time to live has passed."""
        table = tables.renewal(self.routing, self.settings.routing_ttl_s, codec.now_ms())
        if self.routes is not None and table is not None:
            self._publish_table(table)

    def _publish_table(self, table: RoutingTable) -> None:
        self.routes(codec.new_envelope(routing_key(table.deployment), 0, table.to_proto()))
        self.routing = table

    def _serving(self) -> dict[Version, int]:
        rollout = self.rollout
        if rollout is not None:
            percent = self.policy.ladder[rollout.step]
            live = {rollout.canary: percent, rollout.stable: 100 - percent} if rollout.ready else {rollout.stable: 100}
        else:
            try:
                live = {self._stable(): 100}
            except BackendError as e:
                self._backend_failed("status", e)
                return {}
        return self._with_retiring(live)

    def _with_retiring(self, live: dict[Version, int]) -> dict[Version, int]:
        return {**live, **{version: 0 for version, _ in self.retiring.values() if version not in live}}

    def _retire_drained(self) -> None:
        """Drop the withdrawn versions whose drain is over from the table, publish it, then have the backend retire
        them (a failure is retried on the next tick; the stable and the canary are never retired)."""
        now = self.clock()
        for name, (version, due) in list(self.retiring.items()):
            if due <= now:
                del self.retiring[name]
                self._unrouted[name] = version
        self._sync_routes("tick")
        live = {v.name for v in (self.stable, self.rollout and self.rollout.canary) if v}
        routed = {r.version for r in self.routing.routes} if self.routing is not None else set()
        for name, version in list(self._unrouted.items()):
            if name in routed:
                continue  # the table naming it is still in force (publishing it failed): not yet
            try:
                if name not in live and hasattr(self.backend, "retire"):
                    self.backend.retire(version)
            except BackendError as e:
                self._backend_failed("retire", e)
                continue
            del self._unrouted[name]
            log.info("retired %s (drained)", name)

    def _canary_ready(self) -> bool:
        try:
            return self.backend.status().canary_ready
        except BackendError as e:
            self._backend_failed("status", e)
            return False

    # --- announcing ---------------------------------------------------------------------------------------------------

    def _announce(self, action: str, reason: str, evidence: tuple) -> None:
        rollout = self.rollout
        assert rollout is not None
        percent = {"canary": self.policy.ladder[0], "step": self.policy.ladder[rollout.step],
                   "promote": 100}.get(action, 0)
        decision = pb.RolloutDecision(
            version=rollout.canary.name, action=action, percent=percent, reason=reason,
            stable_version=rollout.stable.name, checkpoint_uri=rollout.canary.uri, stable_uri=rollout.stable.uri,
            backend=self.backend.kind, target=self.backend.target, alpha=self.policy.alpha,
            step_elapsed_s=round(self.clock() - rollout.step_started_at, 3), decided_at_unix_ms=codec.now_ms(),
            canary=_arm(rollout.canary.name, rollout.arms, pol.CANARY, self.policy),
            stable=_arm(rollout.stable.name, rollout.arms, pol.STABLE, self.policy),
            comparisons=[pb.RolloutComparison(metric=c.metric, diff_lower=c.lower, diff_upper=c.upper,
                                              margin=c.margin, verdict=c.verdict) for c in evidence])
        self._emit(decision)
        if action in FINAL_ACTIONS:
            self._remember(rollout.canary.name)
        for c in evidence:
            if action == "rollback" and c.verdict == pol.TRIPPED:
                self.metrics.tripped.labels(c.metric.removeprefix("tripwire:")).inc()
        self._gauges(evidence)

    def _announce_reject(self, version: pb.PlannerVersion, reason: str, stable: Version | None = None) -> None:
        stable = stable or self.stable
        name = version.version.strip()
        decision = pb.RolloutDecision(
            version=name, action="reject", percent=0, reason=reason, checkpoint_uri=version.checkpoint_uri,
            stable_version=stable.name if stable else "", stable_uri=stable.uri if stable else "",
            backend=self.backend.kind, target=self.backend.target, alpha=self.policy.alpha,
            decided_at_unix_ms=codec.now_ms())
        self._emit(decision)
        if name:
            self._remember(name)
        if name and name == self.latest:  # a version that cannot be served is not what "latest" pins
            self.latest = self._latest_before
            self._sync_routes(f"{name} rejected")

    def _emit(self, decision: pb.RolloutDecision) -> None:
        key = f"rollout:{decision.version or '(unnamed)'}"
        seq = self._seq.get(decision.version, 0)
        self.sink(codec.new_envelope(key, seq, decision))
        self._count(decision.version, seq + 1)
        self.metrics.decisions.labels(decision.action).inc()
        line = {"event": "rollout_decision", "version": decision.version, "action": decision.action,
                "percent": decision.percent, "stable": decision.stable_version, "reason": decision.reason,
                "backend": decision.backend, "target": decision.target,
                "canary_samples": decision.canary.samples, "stable_samples": decision.stable.samples,
                "evidence": {c.metric: {"lower": round(c.diff_lower, 4), "upper": round(c.diff_upper, 4),
                                        "verdict": c.verdict} for c in decision.comparisons}}
        level = logging.WARNING if decision.action in ("rollback", "reject") else logging.INFO
        log.log(level, json.dumps(line, sort_keys=True))

    # --- helpers -----------------------------------------------------------------------------------------------------

    def _stable(self) -> Version:
        if self.stable is not None:
            return self.stable
        status = self.backend.status()
        candidates = [v for v in status.versions if v.name and v.uri]
        if not candidates:
            raise BackendError(f"{self.backend.target} serves no named version with a checkpoint URI; cannot tell "
                               f"which version is stable", retryable=False)
        best = max(candidates, key=lambda v: v.weight)
        if best.weight <= 50:
            split = ", ".join(f"{v.name or '(previous revision)'} {v.weight}%" for v in status.versions)
            raise BackendError(f"{self.backend.target} splits traffic ({split}) and no earlier decision says which "
                               f"version is stable; finish or undo that canary by hand (docs/deploy.md)")
        self.stable = Version(best.name, best.uri)
        log.info("stable version on %s: %s (%s)", self.backend.target, best.name, best.uri)
        return self.stable

    def _new_rollout(self, canary: Version, stable: Version, step: int) -> Rollout:
        now = self.clock()
        return Rollout(canary=canary, stable=stable, step=step, started_at=now, step_started_at=now,
                       arms=pol.Arms(self.policy.alpha))

    def _defer(self, version: pb.PlannerVersion, error: Exception, queued: bool) -> None:
        """The backend cannot take the version now: keep it (announced once, so a restart finds it) and retry on the
        next ticks."""
        if not queued:
            self._announce_other(version, "queue", f"waits for the backend: {error}", remember=False)
        self.waiting = version

    def _wait(self, version: pb.PlannerVersion) -> None:
        if self.waiting is not None and self.waiting.version != version.version:
            older = self.waiting
            self._announce_other(older, "skip", f"superseded by {version.version} while waiting")
        current = self.rollout.canary.name if self.rollout is not None else ""
        self._announce_other(version, "queue", f"waits for the canary of {current}" if current else
                             "waits for the backend", remember=False)
        self.waiting = version

    def _announce_other(self, version: pb.PlannerVersion, action: str, reason: str, *, remember: bool = True) -> None:
        """A decision about a version that is not the canary (queued, skipped)."""
        stable = self.stable
        decision = pb.RolloutDecision(
            version=version.version, action=action, percent=0, reason=reason, checkpoint_uri=version.checkpoint_uri,
            stable_version=stable.name if stable else "", stable_uri=stable.uri if stable else "",
            backend=self.backend.kind, target=self.backend.target, alpha=self.policy.alpha,
            decided_at_unix_ms=codec.now_ms())
        self._emit(decision)
        if remember:
            self._remember(version.version)

    def _known(self, name: str) -> bool:
        return (name in self._decided or (self.stable is not None and name == self.stable.name)
                or (self.rollout is not None and name == self.rollout.canary.name)
                or (self.waiting is not None and name == self.waiting.version))

    def _remember(self, name: str) -> None:
        self._decided[name] = None
        self._decided.move_to_end(name)
        if len(self._decided) > _REMEMBERED_VERSIONS:
            self._decided.popitem(last=False)

    def _count(self, name: str, next_seq: int) -> None:
        self._seq[name] = max(next_seq, self._seq.get(name, 0))
        self._seq.move_to_end(name)
        if len(self._seq) > _REMEMBERED_VERSIONS:
            self._seq.popitem(last=False)

    def _backend_failed(self, operation: str, error: Exception) -> None:
        self.metrics.backend_errors.labels(operation).inc()
        log.error("rollout backend %s (%s): %s failed: %s", self.backend.kind, self.backend.target, operation, error)

    def _gauges(self, comparisons: tuple = ()) -> None:
        rollout = self.rollout
        self.metrics.canary_percent.set(self.policy.ladder[rollout.step] if rollout else 0)
        if rollout is None:
            return
        arms = rollout.arms
        for arm, index in (("canary", pol.CANARY), ("stable", pol.STABLE)):
            self.metrics.samples.labels(arm).set(float(arms.samples(index)))
            self.metrics.rewarded.labels(arm).set(float(arms.rewarded(index)))
            self.metrics.arm_mean.labels(arm, "reward").set(float(arms.mean(index, pol.REWARD)))
            self.metrics.arm_mean.labels(arm, "error_rate").set(float(arms.mean(index, pol.ERRORS)))
            self.metrics.arm_mean.labels(arm, "latency").set(float(arms.mean(index, pol.LATENCY))
                                                             * self.policy.latency_cap_s)
        for c in comparisons:
            if c.metric in pol.METRICS:
                self.metrics.difference.labels(c.metric, "lower").set(c.lower)
                self.metrics.difference.labels(c.metric, "upper").set(c.upper)
        for name, (_, _, value) in rollout.trips.statistics().items():
            self.metrics.tripwire.labels(name).set(float(value))


def _arm(name: str, arms: pol.Arms, index: int, policy: pol.Policy) -> pb.RolloutArm:
    return pb.RolloutArm(version=name, samples=int(arms.samples(index)), reward_samples=int(arms.rewarded(index)),
                         reward_mean=float(arms.mean(index, pol.REWARD)),
                         error_rate=float(arms.mean(index, pol.ERRORS)),
                         latency_mean_s=float(arms.mean(index, pol.LATENCY)) * policy.latency_cap_s)
