"""The canary gate's work: deploy to the canary replicas, observe, withdraw or promote.

``observe_window`` is one scheduled evaluation of one open window. It sends the version's
golden prompts and the configured probe set through every canary replica and every
production replica over the OpenAI-compatible API -- the logical adapter name as
``model``, exactly as tenants call it -- interleaving the two sides prompt by prompt, so a
busy host slows both alike. Production answers with the adapter's production version, or
with the bare base while the adapter has none. The canary's greedy answers to the golden
prompts are compared with what shadow validation recorded for the version (golden drift).
``registry.rules.canary.judge`` decides; the observation is recorded either way.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from registry.errors import ErrorCode, IllegalTransition, InvalidInput, ReplicaError
from registry.intake.jsonio import loads_object
from registry.records.adapters import utcnow
from registry.rules.canary import CanaryWindow, Observation, SideStats, WindowStatus, judge
from registry.rules.fleet import Replica, ReplicaRole
from registry.rules.names import AdapterName
from registry.service import Registry
from tasks.fleet import promote_and_switch, replica_client, rollback_and_switch
from tasks.replicas import ReplicaClient

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
    """Put a validated version on the canary replicas (switched and verified in place) and
    open its window. Safe to repeat: a version already in canary keeps its window.

    Raises:
        InvalidInput: INVALID_SETTING when the base has no canary replica; the promotion is
            illegal (VALIDATION_REQUIRED for a version that did not pass).
        DeployFailed: a replica could not be switched or verified (nothing moved).
    """
    version = registry.get_version(version_id)
    canaries, _ = stage_replicas(registry, version.name)
    if not canaries:
        raise InvalidInput(
            f"base {version.base_model_id} has no canary replica (loragate fleet add URL --role canary)",
            code=ErrorCode.INVALID_SETTING,
            field="role",
        )
    _, report = promote_and_switch(registry, version_id, "canary", reason="canary gate", progress=progress)
    window, created = registry.open_canary_window(version_id)
    progress(f"canary window {window.id} {'opened' if created else 'already open'} until {window.ends_at:%H:%M:%S}")
    return CanaryDeployment(window, created, report)


# -- observe -----------------------------------------------------------------------------


@dataclass
class _Side:
    latencies_ms: list[float]
    errors: list[str]

    def stats(self) -> SideStats:
        return SideStats.from_samples(self.latencies_ms, self.errors)


def _send(client: ReplicaClient, model: str, probe: Probe, side: _Side) -> str | None:
    try:
        completion = client.complete(model, probe.prompt, probe.max_tokens)
    except ReplicaError as e:
        side.errors.append(e.code.value)
        return None
    side.latencies_ms.append(completion.seconds * 1000)
    return completion.text


def observe_window(registry: Registry, window: CanaryWindow, progress: Progress = _quiet) -> Observation:
    """One evaluation of an open window: probe both sides, judge, record.

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
    golden = 0
    with contextlib.ExitStack() as stack:
        # one connection per replica for the whole observation: latencies are the answers',
        # not TCP set-ups'
        canary_clients = [stack.enter_context(replica_client(registry, r.url, retries=0)) for r in canaries]
        production_clients = [(stack.enter_context(replica_client(registry, r.url, retries=0)), r) for r in productions]
        for round_ in range(registry.settings.canary_probe_rounds):
            for probe in probes:
                if probe.case_id is not None and round_ == 0:
                    golden += 1
                for client in canary_clients:
                    text = _send(client, name, probe, canary)
                    judged = round_ == 0 and probe.case_id is not None
                    if judged and (text is None or text.strip() != answers.get(probe.case_id or "", "").strip()):
                        drifted.add(probe.case_id or "")
                for client, replica in production_clients:
                    model = name if production_version else replica.served_model_name
                    _send(client, model, probe, production)
    drift = len(drifted) / golden if golden else 0.0
    earlier = registry.canary_observations(window.id)
    now = utcnow()
    verdict, checks, reasons = judge(window, canary.stats(), production.stats(), drift, earlier, now)
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
        )
    )
    progress(f"{name} {window.version_id}: {verdict.value} ({'; '.join(reasons)})")
    return observation


# -- decide --------------------------------------------------------------------------------


def withdraw_from_canary(
    registry: Registry, name: str, version_id: str, reason: str, progress: Progress = _quiet
) -> None:
    """The canary replicas go back to production's version (or drop the name) and the
    version becomes ``rolled_back`` with the reason -- unless it is no longer the canary
    (decided under the adapter's lock), so a repeat after a crash moves nothing and a
    version that replaced it meanwhile is never withdrawn by this decision."""
    rollback_and_switch(registry, name, "canary", reason=reason, expected_version=version_id, progress=progress)


def withdraw_canary(registry: Registry, window: CanaryWindow, reason: str, progress: Progress = _quiet) -> CanaryWindow:
    """Auto-rollback: the canary is withdrawn and its window closes."""
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
    if window.status == WindowStatus.PROMOTED and previous == version_id:
        return window, registry.get_adapter(name).previous, []  # a re-run
    if window.status != WindowStatus.READY:
        raise IllegalTransition(
            f"{version_id}'s canary window is {window.status.value}, not ready for production", field="version_id"
        )
    _, report = promote_and_switch(
        registry,
        version_id,
        "production",
        reason=reason,
        progress=progress,
        acknowledge_scan_review=acknowledge_scan_review,
    )
    return registry.close_canary_window(window.id, WindowStatus.PROMOTED, reason), previous, report
