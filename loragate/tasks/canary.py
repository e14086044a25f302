"""The canary gate's work: deploy, open the live split, observe, withdraw or promote.

``deploy_canary`` puts the version on the canary replicas (a switch, verified), opens its
window at share 0, warms it on every production replica as ``name@version`` (verified the
same way) and only then gives it its share of live requests (``tasks/traffic.py``): users
never reach a version that was not loaded and checked where they are served.

``observe_window`` is one scheduled evaluation of one open window. Probes: the version's
golden prompts and the configured probe set, sent as the fleet (never split or counted as
a user's), interleaved prompt by prompt with production's answers so a busy host slows both
alike: while the canary takes live traffic, as ``name@version`` on the production replicas
themselves (both versions on the same replicas); a dark canary on the canary replicas. Live: the
figures every production replica's split counted for both versions in this window.
``loragate.registry.rules.verdict.judge`` decides on both; the observation is recorded either way.

A withdrawal sends 0 % to the canary first (pushed to every replica), then moves the pointer
back; a promotion sends 100 % to the warm canary first, then moves production, then keeps
the replaced version warm as ``name@version`` so a rollback only moves traffic. Each move
unloads the warm copies it leaves behind once it commits (``tasks/warm_copies.py``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loragate.registry.errors import (
    DeployFailed,
    ErrorCode,
    InvalidInput,
    LoragateError,
    ReplicaError,
)
from loragate.registry.intake.jsonio import loads_object
from loragate.registry.records.adapters import utcnow
from loragate.registry.rules.canary import ACTIVE, CanaryWindow, Observation, SideStats, WindowStatus
from loragate.registry.rules.fleet import Replica, ReplicaRole, qualified_name
from loragate.registry.rules.formats import declared_schemas, schema_check
from loragate.registry.rules.live import LiveJudgement, LiveStats, judge_live
from loragate.registry.rules.names import AdapterName
from loragate.registry.rules.verdict import judge
from loragate.registry.service import Registry
from loragate.tasks.fleet import promote_and_switch, rollback_and_switch
from loragate.tasks.replicas import Completion, ReplicaClient, replica_client
from loragate.tasks.routes import push_routes
from loragate.tasks.traffic import cool_version, read_traffic, warm_version
from loragate.tasks.traffic_watch import TrafficAlert, alerts_in, record_alerts

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


@dataclass(frozen=True)
class Probe:
    prompt: str
    max_tokens: int
    case_id: str | None = None  # golden case: its answer is compared with validation's


def load_probe_set(path: str | None) -> list[Probe]:
    """The extra probes of ``LORAGATE_CANARY_PROBE_SET``: JSONL of {"prompt", "max_tokens"}.

    Raises:
        InvalidInput: INVALID_SETTING naming the line that is not a probe.
    """
    if not path:
        return []
    try:
        text = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise InvalidInput(
            f"canary probe set {path} cannot be read ({type(e).__name__})",
            code=ErrorCode.INVALID_SETTING,
            field="LORAGATE_CANARY_PROBE_SET",
        ) from e
    probes = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            data = loads_object(
                line, what="canary probe", code=ErrorCode.INVALID_SETTING, field="LORAGATE_CANARY_PROBE_SET"
            )
            probes.append(Probe(str(data["prompt"]), int(data.get("max_tokens", 16))))
        except (InvalidInput, KeyError, TypeError, ValueError) as e:
            raise InvalidInput(
                f"canary probe set {path} line {number} is not {{'prompt': ..., 'max_tokens': ...}}",
                code=ErrorCode.INVALID_SETTING,
                field="LORAGATE_CANARY_PROBE_SET",
            ) from e
    return probes


def stage_replicas(registry: Registry, name: str) -> tuple[list[Replica], list[Replica]]:
    base = AdapterName.parse(name).base
    replicas = registry.list_replicas(base)
    return (
        [r for r in replicas if r.role == ReplicaRole.CANARY],
        [r for r in replicas if r.role == ReplicaRole.PRODUCTION],
    )


# -- deploy ------------------------------------------------------------------------------


@dataclass(frozen=True)
class CanaryDeployment:
    window: CanaryWindow
    created: bool
    replicas: list[dict[str, Any]]


def deploy_canary(registry: Registry, version_id: str, progress: Progress = _quiet) -> CanaryDeployment:
    """Put a validated version on the canary replicas (switched and verified in place), open
    its window, and -- once the adapter has a production version to split with -- warm it
    on the production replicas and give it its share of live requests. Safe to repeat: a
    version already in canary keeps its window.

    Raises:
        InvalidInput: INVALID_SETTING when the version would be served nowhere (no canary
            replica, and no live split: no production replica, version or share); the promotion is
            illegal (VALIDATION_REQUIRED for a version that did not pass).
        IllegalTransition: VALIDATION_REQUIRED or SIGNATURE_REQUIRED, a version whose canary
            window the registry would refuse (nothing moved).
        DeployFailed: a replica could not be switched or verified (nothing moved).
    """
    version = registry.get_version(version_id)
    registry.check_canary_ready(version_id)  # its window would be refused: move nothing
    canaries, productions = stage_replicas(registry, version.name)
    share = registry.settings.canary_share
    # nothing to split while the adapter has no production version: its first canary is dark
    splits = bool(productions) and registry.get_adapter(version.name).production is not None
    if not canaries and not (splits and share > 0):
        raise InvalidInput(
            f"base {version.base_model_id} has no canary replica (loragate fleet add URL --role canary) "
            "and no production replica to split live traffic on (LORAGATE_CANARY_SHARE > 0)",
            code=ErrorCode.INVALID_SETTING,
            field="role",
        )
    _, report = promote_and_switch(registry, version_id, "canary", reason="canary gate", progress=progress)
    window, created = registry.open_canary_window(version_id, share=0.0)
    progress(f"canary window {window.id} {'opened' if created else 'already open'} until {window.ends_at:%H:%M:%S}")
    if splits and (share > 0 or window.share > 0):
        try:
            report += warm_version(registry, version.name, version_id, progress)
        except DeployFailed as e:
            withdraw_canary(registry, window, f"canary could not be warmed on production: {e.message}", progress)
            raise
        if created and share > 0:
            window = registry.set_canary_share(version.name, share, reason="canary gate: live split opened")
        push_routes(registry, version.name, progress)
        progress(f"{version.name}: {window.share:.2%} of live requests to {version_id}")
    return CanaryDeployment(window, created, report)


# -- observe -----------------------------------------------------------------------------


@dataclass
class _Side:
    latencies_ms: list[float]
    errors: list[str]

    def stats(self) -> SideStats:
        return SideStats.from_samples(self.latencies_ms, self.errors)


def _send(client: ReplicaClient, model: str, probe: Probe, side: _Side) -> Completion | None:
    try:
        # as the fleet: the replicas' split passes a probe through as named, uncounted
        completion = client.complete(model, probe.prompt, probe.max_tokens, admin=True)
    except ReplicaError as e:
        side.errors.append(e.code.value)
        return None
    side.latencies_ms.append(completion.seconds * 1000)
    return completion


def observe_window(
    registry: Registry, window: CanaryWindow, progress: Progress = _quiet
) -> tuple[Observation, list[TrafficAlert]]:
    """One evaluation of an open window: probe both sides, read the live figures, judge,
    record; returns the observation and the traffic alerts recorded now (to announce).

    Raises:
        InvalidInput: the probe set setting is unreadable.
    """
    name = window.adapter_name
    canaries, productions = stage_replicas(registry, name)
    production_version = registry.get_adapter(name).production
    expected = registry.expected_outputs(window.version_id)
    probes = [] if expected is None else [Probe(c.prompt, c.max_tokens, c.id) for c in expected[0].cases]
    probes += load_probe_set(registry.settings.canary_probe_set)
    canary, production = _Side([], []), _Side([], [])
    answers = expected[1] if expected is not None else {}
    drifted: set[str] = set()
    pairs: list[tuple[float, float]] = []
    golden = 0
    with contextlib.ExitStack() as stack:
        # one connection per replica for the whole observation: latencies are the answers',
        # not TCP set-ups'
        canary_clients = [(stack.enter_context(replica_client(registry, r.url, retries=0)), name) for r in canaries]
        production_clients = [(stack.enter_context(replica_client(registry, r.url, retries=0)), r) for r in productions]
        if window.share > 0 and production_version and production_clients:
            # warm on the production replicas: the same replicas answer for both versions, so
            # a canary pool busy with other canaries' probes does not make this one look slow
            warm_as = qualified_name(name, window.version_id)
            canary_clients = [(client, warm_as) for client, _ in production_clients]
        for round_ in range(registry.settings.canary_probe_rounds):
            for probe in probes:
                if probe.case_id is not None and round_ == 0:
                    golden += 1
                canary_answers = []
                for client, model in canary_clients:
                    answered = _send(client, model, probe, canary)
                    canary_answers.append(answered)
                    judged = round_ == 0 and probe.case_id is not None
                    text = None if answered is None else answered.text
                    if judged and (text is None or text.strip() != answers.get(probe.case_id or "", "").strip()):
                        drifted.add(probe.case_id or "")
                production_answers = []
                for client, replica in production_clients:
                    model = name if production_version else replica.served_model_name
                    production_answers.append(_send(client, model, probe, production))
                # the j-th canary answer with the j-th production one: the same prompt, moments apart
                pairs += [
                    (c.seconds * 1000, p.seconds * 1000)
                    for c, p in zip(canary_answers, production_answers, strict=False)
                    if c is not None and p is not None
                ]
    drift = len(drifted) / golden if golden else 0.0
    live, alerts = _live_judgement(registry, window, production_version)
    earlier = registry.canary_observations(window.id)
    now = utcnow()
    paired = tuple((round(c, 3), round(p, 3)) for c, p in pairs)
    verdict, checks, reasons = judge(
        window, canary.stats(), production.stats(), drift, earlier, now, live=live, pairs_ms=paired
    )
    observation = registry.record_canary_observation(
        Observation(
            window_id=window.id,
            at=now,
            canary=canary.stats(),
            production=production.stats(),
            drift=drift,
            drifted_cases=sorted(drifted),
            verdict=verdict,
            monitors=checks,
            reasons=reasons,
            live=None if live is None else live.as_dict(),
            pairs_ms=paired,
        )
    )
    progress(f"{name} {window.version_id}: {verdict.value} ({'; '.join(reasons)})")
    return observation, alerts


def _live_judgement(
    registry: Registry, window: CanaryWindow, production_version: str | None
) -> tuple[LiveJudgement | None, list[TrafficAlert]]:
    """The live figures of both versions in this window, summed over the production
    replicas, judged (None while the window's share is 0: a dark canary, probes only), and
    the traffic alerts they raise that were recorded now. Where the canary's golden set
    declares output schemas, the sampled live answers are checked against them."""
    documents, unreachable = read_traffic(registry, window.adapter_name)
    raised = alerts_in(documents, window.adapter_name, registry.settings.fallback_alert_rate)
    alerts = record_alerts(registry, raised)
    if window.share <= 0:
        return None, alerts
    live = LiveStats.from_replicas(documents, window.adapter_name, window.id, window.version_id, production_version)
    expected = registry.expected_outputs(window.version_id)
    check = schema_check(declared_schemas(None if expected is None else expected[0]))
    judgement = judge_live(window.thresholds, live, window.share, format_check=check)
    if unreachable:
        judgement.not_ready_reasons.append(f"live figures of {len(unreachable)} replica(s) unreadable")
    return judgement, alerts


# -- decide --------------------------------------------------------------------------------


def withdraw_from_canary(
    registry: Registry, name: str, version_id: str, reason: str, progress: Progress = _quiet
) -> None:
    """The canary replicas go back to production's version (or drop the name) and the
    version becomes ``rolled_back`` with the reason -- unless it is no longer the canary
    (decided under the adapter's lock), so a repeat after a crash moves nothing and a
    version that replaced it meanwhile is never withdrawn by this decision."""
    push_routes(registry, name, progress)  # a closed window's canary gets no traffic from here on
    rollback_and_switch(registry, name, "canary", reason=reason, expected_version=version_id, progress=progress)
    cool_version(registry, name, version_id, progress)


def withdraw_canary(registry: Registry, window: CanaryWindow, reason: str, progress: Progress = _quiet) -> CanaryWindow:
    """Auto-rollback: the canary gets 0 % of live traffic on every replica at once, then is
    withdrawn, and its window closes."""
    current = registry.canary_window(window.id)
    if current.status in ACTIVE and current.share > 0:
        registry.set_canary_share(window.adapter_name, 0.0, reason=reason[:200])
    withdraw_from_canary(registry, window.adapter_name, window.version_id, reason, progress)
    return registry.close_canary_window(window.id, WindowStatus.ROLLED_BACK, reason)


def promote_canary(
    registry: Registry,
    version_id: str,
    reason: str,
    progress: Progress = _quiet,
    *,
    acknowledge_scan_review: bool = False,
) -> tuple[CanaryWindow, str | None, list[dict[str, Any]]]:
    """Production moves to the signed-off canary and every production replica is switched
    in place and verified, all or nothing; returns (its window, previous production,
    per-replica report).

    Raises:
        IllegalTransition: the version's window is not ready, or the lifecycle forbids it.
        DeployFailed: a replica could not be switched or verified (nothing moved).
    """
    window = registry.latest_canary_window(version_id)
    name = window.adapter_name
    previous = registry.get_adapter(name).production
    if window.promoted_already(previous):
        return window, registry.get_adapter(name).previous, []  # a re-run
    share_before = window.share
    # every user to the warm canary first, so the switch below moves no user's traffic -- only
    # on a person's sign-off pending (or as the owner): without one the switch moves them
    all_users_first = 0 < share_before < 1 and registry.canary_share_allowed(window, 1.0)
    if all_users_first:
        registry.set_canary_share(name, 1.0, reason="promotion: all live traffic to the canary")
        push_routes(registry, name, progress)
    try:
        _, report = promote_and_switch(
            registry,
            version_id,
            "production",
            reason=reason,
            progress=progress,
            acknowledge_scan_review=acknowledge_scan_review,
        )
    except BaseException:
        if all_users_first:
            registry.set_canary_share(name, share_before, reason="promotion failed: the split as it was")
            push_routes(registry, name, progress)
        raise
    closed = registry.close_canary_window(window.id, WindowStatus.PROMOTED, reason)
    push_routes(registry, name, progress)
    keep_previous_warm(registry, name, previous, progress)
    return closed, previous, report


def keep_previous_warm(registry: Registry, name: str, previous: str | None, progress: Progress = _quiet) -> None:
    """After a promotion: the replaced version stays warm as ``name@version`` on the
    production replicas, so rolling back only moves traffic. The promotion itself already put
    the promoted version under the plain name and unloaded its warm copy and the previous
    previous (``tasks/warm_copies.py``). Best effort: without a warm previous, a rollback
    reloads, as it always could."""
    if previous is None:
        return
    try:
        warm_version(registry, name, previous, progress)
    except (DeployFailed, LoragateError) as e:
        progress(f"{name}: previous {previous} not kept warm ({e.one_line()}); a rollback will reload")
