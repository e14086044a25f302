"""The canary watch's evaluation: what a window's canary and production answered, judged.
Its moves -- put on canary, withdraw, promote -- are ``tasks/canary_moves.py``.

``observe_window`` is one scheduled evaluation of one open window. Probes: the version's
golden prompts and the configured probe set, sent as the fleet (never split or counted as
a user's), interleaved prompt by prompt with production's answers so a busy host slows both
alike: while the canary takes live traffic, as ``name@version`` on the production replicas
themselves (both versions on the same replicas); a dark canary on the canary replicas. Live: the
figures every production replica's split counted for both versions in this window.
``loragate.registry.rules.verdict.judge`` decides on both; the observation is recorded either way.
A window whose traffic will not bring the live requests its verdict needs by its end gets a
larger share, within its cap (``canary_moves.ramp_canary``).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loragate.registry.errors import (
    ErrorCode,
    InvalidInput,
    ReplicaError,
)
from loragate.registry.intake.jsonio import loads_object
from loragate.registry.progress import Progress, quiet
from loragate.registry.records.adapters import utcnow
from loragate.registry.rules.canary import CanaryWindow, Observation, SideStats, Verdict, WindowStatus
from loragate.registry.rules.fleet import qualified_name
from loragate.registry.rules.formats import declared_schemas, schema_check
from loragate.registry.rules.live import LiveJudgement, LiveStats, judge_live
from loragate.registry.rules.replica_agreement import held_without_a_replica, judged_without_each, needs_agreement
from loragate.registry.rules.verdict import judge, probe_error_evidence, probe_latency_evidence
from loragate.registry.service import Registry
from loragate.tasks.canary_moves import ramp_canary
from loragate.tasks.live_figures import READ_FROM, AdapterFigures, read_live_figures
from loragate.tasks.replicas import Completion, ReplicaClient, replica_client
from loragate.tasks.routes import stage_replicas
from loragate.tasks.traffic_watch import TrafficAlert, alerts_in, record_alerts

# what ``observe_canary`` answers for a window it had no time for: the next evaluation's first
DEFERRED = "deferred"


@dataclass(frozen=True)
class EvaluationPlan:
    """One ``canary-evaluate`` run's work: the open windows, least recently observed first;
    how many it observes at once; and when (epoch seconds) it stops starting observations."""

    windows: list[CanaryWindow]
    at_once: int
    start_by: float


def evaluation_plan(registry: Registry, now: float | None = None) -> EvaluationPlan:
    """The plan of an evaluation starting ``now`` (epoch seconds), from the registry's settings:
    ``canary_observed_at_once`` and ``canary_evaluate_budget_s``."""
    settings = registry.settings
    return EvaluationPlan(
        registry.canary_windows((WindowStatus.OPEN,), least_recently_observed=True),
        settings.canary_observed_at_once,
        (time.time() if now is None else now) + settings.canary_evaluate_budget_s,
    )


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


# -- observe -----------------------------------------------------------------------------


@dataclass
class _Side:
    latencies_ms: list[float]
    errors: list[str]

    def stats(self) -> SideStats:
        return SideStats.from_samples(self.latencies_ms, self.errors)


def _send(
    client: ReplicaClient, model: str, probe: Probe, side: _Side, matched: Completion | None = None
) -> Completion | None:
    """A probe's answer, asked again once before its failure counts: one lost request on a
    busy replica is not a version's error, and both sides get the same second chance.
    ``matched``: the canary's answer this one is the reference of -- asked for exactly as many
    tokens (``_reference_tokens``)."""
    tokens = _reference_tokens(probe, matched)

    def ask() -> Completion:
        # as the fleet: the replicas' split passes a probe through as named, uncounted
        if tokens is None:
            return client.complete(model, probe.prompt, probe.max_tokens, admin=True)
        return client.complete(model, probe.prompt, tokens, admin=True, exact_tokens=True)

    try:
        completion = ask()
    except ReplicaError:
        try:
            completion = ask()
        except ReplicaError as e:
            side.errors.append(e.code.value)
            return None
    side.latencies_ms.append(completion.seconds * 1000)
    return completion


def _reference_tokens(probe: Probe, matched: Completion | None) -> int | None:
    """How many tokens a reference generates: as many as the canary's answer to the same
    prompt, where it says. Two answers of one prompt can differ in length several times -- a
    trained adapter stops at its own end of text, the bare base runs on to ``max_tokens`` --
    and a pair of unequal work compares lengths, not speed: per answer the 3x-slow control of
    ``bench/scale.py`` read 1.3-1.7x its base, and per token a short answer's prefill made a
    good first canary look 3x slower. None: as the probe asks (no canary answer to match)."""
    if matched is None or not matched.token_ids:
        return None
    return len(matched.token_ids)


def _drifted(client: ReplicaClient, model: str, probe: Probe, first: Completion | None, expected: str) -> bool:
    """Whether a golden case's greedy answer differs from the one validation recorded,
    confirmed on a second read: a real drift answers the same way twice, a garbled read
    does not. An unanswered probe is no drift: its error is the probe error rule's to judge."""
    if first is None:
        return False
    if first.text.strip() == expected:
        return False
    try:
        again = client.complete(model, probe.prompt, probe.max_tokens, admin=True)
    except ReplicaError:
        return False  # the first read differed, the second never came: not confirmed
    return again.text.strip() != expected


def observe_window(
    registry: Registry, window: CanaryWindow, progress: Progress = quiet, figures: AdapterFigures | None = None
) -> tuple[Observation, list[TrafficAlert]]:
    """One evaluation of an open window: probe both sides, read the live figures, judge,
    record; returns the observation and the traffic alerts recorded now (to announce).
    ``figures``: the adapter's part of the replicas' figures the evaluation read once for
    every window (None: read them now).

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
        if production_version is None and canary_clients:
            # a first canary's reference is the base on its own replica, asked right after it:
            # the same engine, its batches shared with the other canaries' adapters -- the bare
            # base on a production replica shares the prompt, not the load
            production_clients = [
                (client, replica) for (client, _), replica in zip(canary_clients, canaries, strict=True)
            ]
        elif window.share > 0 and production_version and production_clients:
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
                    if round_ == 0 and probe.case_id is not None:
                        expected_answer = answers.get(probe.case_id, "").strip()
                        if _drifted(client, model, probe, answered, expected_answer):
                            drifted.add(probe.case_id)
                production_answers = []
                for j, (client, replica) in enumerate(production_clients):
                    model = name if production_version else replica.served_model_name
                    matched = canary_answers[j] if j < len(canary_answers) else None
                    production_answers.append(_send(client, model, probe, production, matched))
                # the j-th canary answer with the j-th production one: the same prompt, moments apart
                pairs += [
                    _paired(c, p)
                    for c, p in zip(canary_answers, production_answers, strict=False)
                    if c is not None and p is not None
                ]
    drift = len(drifted) / golden if golden else 0.0
    earlier = registry.canary_observations(window.id)
    look = 1 + sum(1 for o in earlier if o.live is not None)
    if figures is None:
        figures = read_live_figures(registry, [name]).of(name)
    live, alerts = _live_judgement(registry, window, production_version, _error_evidence(earlier), look, figures)
    now = utcnow()
    paired = tuple((round(c, 3), round(p, 3)) for c, p in pairs)
    probe_errors = probe_error_evidence(window.thresholds, canary.stats(), production.stats(), earlier)
    probe_latency = probe_latency_evidence(
        window.thresholds, canary.stats(), production.stats(), paired, production_version is None, earlier
    )
    verdict, checks, reasons = judge(
        window,
        canary.stats(),
        production.stats(),
        drift,
        earlier,
        now,
        live=live,
        pairs_ms=paired,
        against_base=production_version is None,
        probe_evidence=probe_errors,
        latency_evidence=probe_latency,
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
            probe_evidence=probe_errors.as_dict(),
            latency_evidence=probe_latency.as_dict(),
        )
    )
    progress(f"{name} {window.version_id}: {verdict.value} ({'; '.join(reasons)})")
    if verdict == Verdict.CONTINUE and live is not None:
        production_side = live.stats.production
        ramp_canary(registry, window, live.coverage, (production_side.requests, production_side.errors), progress)
    return observation, alerts


def _paired(canary: Completion, production: Completion) -> tuple[float, float]:
    """A back-to-back pair in milliseconds per answer: the reference generated as many tokens
    as the canary (``_reference_tokens``), so the two answers are the same work."""
    return canary.seconds * 1000, production.seconds * 1000


def _error_evidence(earlier: list[Observation]) -> dict[str, Any] | None:
    """The sequential error evidence the window's latest live judgement kept, if any."""
    for observation in reversed(earlier):
        if observation.live and observation.live.get("error_evidence"):
            return observation.live["error_evidence"]
    return None


def _live_judgement(
    registry: Registry,
    window: CanaryWindow,
    production_version: str | None,
    previous: dict[str, Any] | None,
    look: int,
    figures: AdapterFigures,
) -> tuple[LiveJudgement | None, list[TrafficAlert]]:
    """The live figures of both versions in this window, summed over the production
    replicas, judged (None while the window's share is 0: a dark canary, probes only), and
    the traffic alerts they raise that were recorded now. Where the canary's golden set
    declares output schemas, the sampled live answers are checked against them."""
    documents, unreachable = figures.documents, figures.unreadable
    raised = alerts_in(documents, window.adapter_name, registry.settings.fallback_alert_rate)
    alerts = record_alerts(registry, raised)
    if window.share <= 0:
        return None, alerts
    live = LiveStats.from_replicas(documents, window.adapter_name, window.id, window.version_id, production_version)
    expected = registry.expected_outputs(window.version_id)
    check = schema_check(declared_schemas(None if expected is None else expected[0]))
    now = utcnow()
    judgement = judge_live(
        window.thresholds,
        live,
        window.share,
        format_check=check,
        previous=previous,
        every_replica=not unreachable,
        elapsed_s=(now - window.opened_at).total_seconds(),
        remaining_s=(window.ends_at - now).total_seconds(),
        look=look,
    )
    if needs_agreement(judgement, len(documents)):

        def judged(others: list[dict[str, Any]]) -> LiveJudgement:
            # the window's figures so far, judged at once: earlier looks' evidence held all replicas'
            versions = (window.version_id, production_version)
            rest = LiveStats.from_replicas(others, window.adapter_name, window.id, *versions)
            return judge_live(window.thresholds, rest, window.share)

        without = judged_without_each(documents, judged, READ_FROM)
        judgement = held_without_a_replica(judgement, without)
    if unreachable:
        judgement.not_ready_reasons.append(f"live figures of {len(unreachable)} replica(s) unreadable")
    return judgement, alerts
