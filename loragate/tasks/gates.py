"""Prefect wrappers of the pipeline's gates: thin, each opening the registry the worker's
``LORAGATE_*`` environment names with the token of the least role the gate needs, from the
worker's secrets directory (settings and secrets never travel as parameters: Prefect stores
and shows them; ``tasks/credentials.py``).

Retries are declared only where repeating is harmless: registering (content-addressed:
the same bytes again write nothing), reading, probing, and fleet moves that re-plan from the
pointers under the adapter's lock (a move already made is an empty plan) -- and only for
outages (``Unavailable``, an unreachable replica), never for a refusal, which would be
refused again.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.logging import get_run_logger
from prefect.transactions import get_transaction

from loragate.registry.errors import DeployFailed, IllegalTransition, NotFound
from loragate.registry.progress import Progress
from loragate.registry.render.validation import validation_evidence_markdown
from loragate.registry.retrying import is_outage
from loragate.registry.rules.access import Role
from loragate.registry.rules.canary import CanaryWindow, Observation, WindowStatus
from loragate.registry.rules.lifecycle import Stage, ValidationStatus
from loragate.registry.rules.names import AdapterName
from loragate.registry.settings import Settings
from loragate.tasks import canary, canary_moves, fleet, notify, reconcile
from loragate.tasks.credentials import registry_as, signing_key
from loragate.tasks.live_figures import AdapterFigures

RETRY_DELAYS_S: list[float] = [2, 10, 30]


def outage_only(task: Any, task_run: Any, state: Any) -> bool:
    """Retry a task whose failure was an outage (``retrying.is_outage``); a refusal would be
    refused again."""
    try:
        state.result()
    except BaseException as e:
        return is_outage(e)
    return False


def _log(message: str) -> None:
    get_run_logger().info(message)


def _progress() -> Progress:
    """The run's logger, bound now: fleet switches report from worker threads, which have
    no Prefect run context of their own."""
    return get_run_logger().info


@task(
    cache_policy=NO_CACHE,
    name="register-bundle",
    retries=3,
    retry_delay_seconds=RETRY_DELAYS_S,
    retry_condition_fn=outage_only,
)
def register_bundle(bundle: str, name: str, golden_set: str | None = None) -> dict[str, Any]:
    """Register the bundle; a golden set that came with it is attached to the adapter (the
    same set again changes nothing)."""
    with registry_as(Role.TRAINING) as registry:
        result = registry.register_from(bundle, name, progress=_progress())
        if golden_set:
            registry.attach_golden_set(name, Path(golden_set))
    v = result.version
    return {"version_id": v.version_id, "name": v.name, "base": v.base_model_id, "created": result.created}


@task(
    cache_policy=NO_CACHE,
    name="versions-to-validate",
    retries=3,
    retry_delay_seconds=RETRY_DELAYS_S,
    retry_condition_fn=outage_only,
)
def versions_to_validate(base: str) -> tuple[list[str], list[dict[str, str]]]:
    """(pending versions of the base, versions that passed but never entered canary): the
    second list lets a re-run announce what a crashed run validated but did not announce."""
    with registry_as(Role.SIGNING) as registry:
        versions = [v for v in registry.list_versions() if v.base_model_id == base and v.stage == Stage.STAGING]
        without_golden = set()
        for name in {v.name for v in versions if v.validation_status == ValidationStatus.PENDING}:
            try:
                registry.golden_set(name)
            except NotFound:
                without_golden.add(name)
                _log(f"{name} has no golden set attached: its versions wait (loragate golden set {name} FILE)")
    pending = [
        v.version_id
        for v in versions
        if v.validation_status == ValidationStatus.PENDING and v.name not in without_golden
    ]
    passed = [
        {"version_id": v.version_id, "name": v.name} for v in versions if v.validation_status == ValidationStatus.PASSED
    ]
    return pending, passed


@task(
    cache_policy=NO_CACHE,
    name="deploy-canary",
    retries=2,
    retry_delay_seconds=RETRY_DELAYS_S,
    retry_condition_fn=outage_only,
)
def deploy_canary(version_id: str) -> dict[str, Any]:
    with registry_as(Role.SIGNING) as registry:
        deployment = canary_moves.deploy_canary(registry, version_id, progress=_progress())
    if deployment.window is None:
        raise IllegalTransition(f"{version_id} was replaced as the canary before its window opened", field="version_id")
    return {
        "window": deployment.window.as_dict(),
        "created": deployment.created,
        "replicas": deployment.replicas,
    }


@task(
    cache_policy=NO_CACHE,
    name="open-canary-windows",
    retries=3,
    retry_delay_seconds=RETRY_DELAYS_S,
    retry_condition_fn=outage_only,
)
def open_canary_windows() -> canary.EvaluationPlan:
    with registry_as(Role.ACTIVATION) as registry:
        return canary.evaluation_plan(registry)


@task(cache_policy=NO_CACHE, name="observe-canary")
def observe_canary(
    window_id: int, figures: AdapterFigures | None = None, start_by: float | None = None
) -> tuple[Observation, list[Observation], list[dict[str, Any]]] | str | None:
    """One observation (recorded: not retried), the window's observations so far and the
    live-traffic alerts recorded now; None when the version is no longer the canary (moved
    by hand): its window is superseded; ``canary.DEFERRED`` when started after ``start_by``
    (epoch seconds, the evaluation's budget): left for the next evaluation. ``figures``: the
    adapter's part of the live figures the evaluation read once for every window
    (``watch_tasks.read_canary_figures``)."""
    if start_by is not None and time.time() > start_by:
        return canary.DEFERRED
    with registry_as(Role.ACTIVATION) as registry:
        window = registry.canary_window(window_id)
        if registry.get_adapter(window.adapter_name).canary != window.version_id:
            registry.close_canary_window(window_id, WindowStatus.SUPERSEDED, "no longer the canary")
            _log(f"{window.version_id} is no longer the canary of {window.adapter_name}: window closed")
            return None
        observation, alerts = canary.observe_window(registry, window, progress=_progress(), figures=figures)
        return observation, registry.canary_observations(window_id), [a.as_dict() for a in alerts]


@task(
    cache_policy=NO_CACHE,
    name="withdraw-canary",
    retries=2,
    retry_delay_seconds=RETRY_DELAYS_S,
    retry_condition_fn=outage_only,
)
def withdraw_canary(window_id: int, reason: str) -> dict[str, Any]:
    with registry_as(Role.ACTIVATION) as registry:
        window = canary_moves.withdraw_canary(registry, registry.canary_window(window_id), reason, progress=_progress())
        production = registry.get_adapter(window.adapter_name).production
    return {"window": window.as_dict(), "back_to": production}


@task(
    cache_policy=NO_CACHE,
    name="canary-window",
    retries=3,
    retry_delay_seconds=RETRY_DELAYS_S,
    retry_condition_fn=outage_only,
)
def canary_window_of(version_id: str) -> tuple[CanaryWindow, list[Observation], dict[str, Any]]:
    """The version's newest window, its observations, and the adapter's pointers."""
    with registry_as(Role.ACTIVATION) as registry:
        window = registry.latest_canary_window(version_id)
        adapter = registry.get_adapter(window.adapter_name)
        return window, registry.canary_observations(window.id), adapter.as_dict()


@task(
    cache_policy=NO_CACHE,
    name="validation-evidence",
    retries=3,
    retry_delay_seconds=RETRY_DELAYS_S,
    retry_condition_fn=outage_only,
)
def validation_evidence(version_id: str) -> tuple[str | None, str | None]:
    """The version's latest validation as markdown for the sign-off, and its weight scan's
    review (what the reviewer must acknowledge), when it asked for one."""
    with registry_as(Role.ACTIVATION) as registry:
        runs = registry.validation_runs(version_id)
        review = registry.scan_under_review(version_id)
    return (validation_evidence_markdown(runs[-1].report) if runs else None), (review.describe() if review else None)


@task(cache_policy=NO_CACHE, name="claim-approval")
def claim_approval(window_id: int, flow_run_id: str, replacing: str | None) -> CanaryWindow:
    with registry_as(Role.ACTIVATION) as registry:
        return registry.request_approval(window_id, flow_run_id, replacing)


@task(cache_policy=NO_CACHE, name="record-approval")
def record_approval(
    window_id: int,
    approve: bool,
    reviewer: str,
    comment: str,
    code: str,
    flow_run_id: str,
    acknowledge_scan_review: bool = False,
) -> CanaryWindow:
    """The decision, recorded only when ``code`` proves it (``ApprovalRefused`` otherwise, or
    ``IllegalTransition`` for an unacknowledged scan review: the code is spent either way, so
    a retry would be refused again)."""
    with registry_as(Role.ACTIVATION) as registry:
        return registry.record_approval(
            window_id,
            approve=approve,
            reviewer=reviewer,
            comment=comment,
            code=code,
            flow_run_id=flow_run_id,
            acknowledge_scan_review=acknowledge_scan_review,
        )


@task(cache_policy=NO_CACHE, name="withdraw-rejected-canary")
def withdraw_rejected_canary(version_id: str, reason: str) -> None:
    """A canary a person rejected leaves the canary replicas (its window is already closed)."""
    with registry_as(Role.ACTIVATION) as registry:
        name = registry.get_version(version_id).name
        canary_moves.withdraw_from_canary(registry, name, version_id, reason, progress=_progress())


@task(cache_policy=NO_CACHE, name="promote-production")
def promote_production(version_id: str, reason: str, acknowledge_scan_review: bool = False) -> dict[str, Any]:
    """Inside the promotion's transaction: what it changed is kept on the transaction, so
    the rollback hook can restore it."""
    with registry_as(Role.ACTIVATION) as registry:
        window, previous, report = canary_moves.promote_canary(
            registry, version_id, reason, progress=_progress(), acknowledge_scan_review=acknowledge_scan_review
        )
    name = window.adapter_name
    transaction = get_transaction()
    if transaction is not None and report:
        transaction.set(
            "promoted", {"name": name, "version_id": version_id, "previous": previous, "window_id": window.id}
        )
    return {"name": name, "version_id": version_id, "previous": previous, "replicas": report}


@promote_production.on_rollback
def _restore_previous_production(transaction: Any) -> None:
    """A later step of the promotion failed after production moved: production goes back to
    the version it replaced, in place, on every replica."""
    promoted = transaction.get("promoted", None)
    if not promoted or not promoted.get("previous"):
        return
    reason = "promotion rolled back: its verification failed"
    with registry_as(Role.ACTIVATION) as registry:
        fleet.rollback_and_switch(
            registry, promoted["name"], "production", reason=reason, expected_version=promoted["version_id"]
        )
        registry.close_canary_window(promoted["window_id"], WindowStatus.ROLLED_BACK, reason)


@task(
    cache_policy=NO_CACHE,
    name="verify-stage",
    retries=2,
    retry_delay_seconds=[2.0, 5.0],
    retry_condition_fn=outage_only,
)
def verify_stage(name: str, version_id: str) -> list[dict[str, Any]]:
    """Every replica of the adapter's base serves what the pointers say for it: no drift.

    Raises:
        DeployFailed: a replica is unreachable or serves something else.
    """
    with registry_as(Role.ACTIVATION) as registry:
        states = reconcile.fleet_status(registry)
    base = AdapterName.parse(name).base
    mine = [s for s in states if s.replica.base_model_id == base]
    bad = [s for s in mine if not s.reachable or any(a.name == name for a in s.actions)]
    if bad:
        detail = "; ".join(f"{s.replica.url}: {s.error or [a.describe() for a in s.actions]}" for s in bad)
        raise DeployFailed(f"{name} is not served as the registry says after moving to {version_id}: {detail}")
    return [s.as_dict() for s in mine]


@task(cache_policy=NO_CACHE, name="authorize-rollback")
def authorize_rollback(
    name: str, stage: str, expected_version: str | None, code: str, flow_run_id: str
) -> dict[str, Any] | None:
    """The version to roll back, once ``code`` proves a person asked for it (redeemed now:
    single-use, so never retried); None when the stage no longer serves
    ``expected_version`` (a re-run of a rollback that already happened needs no code).
    ``ApprovalRefused`` otherwise, audited: nothing moves."""
    with registry_as(Role.ACTIVATION) as registry:
        proven = registry.redeem_rollback_code(
            name, stage, code, expected_version=expected_version, used_by=flow_run_id
        )
    if proven is None:
        return None
    return {"version_id": proven.version_id, "reviewer": proven.reviewer, "token_id": proven.token_id}


@task(
    cache_policy=NO_CACHE,
    name="rollback-stage",
    retries=2,
    retry_delay_seconds=RETRY_DELAYS_S,
    retry_condition_fn=outage_only,
)
def rollback_stage(name: str, stage: str, expected_version: str | None, reason: str) -> dict[str, Any]:
    """Roll ``stage`` back, unless it no longer names ``expected_version`` (decided under
    the adapter's lock: a re-run of a rollback that already happened, or a promotion that
    landed since the decision, changes nothing)."""
    with registry_as(Role.ACTIVATION) as registry:
        plan, report = fleet.rollback_and_switch(
            registry, name, stage, reason=reason, expected_version=expected_version, progress=_progress()
        )
        if plan.empty:
            adapter = registry.get_adapter(name)
            now = adapter.production if stage == "production" else adapter.canary
            return {"name": name, "stage": stage, "from": expected_version, "to": now, "moved": False}
    moved = {"from": plan.audit_from, "to": plan.audit_to, "moved": True, "replicas": report}
    return {"name": name, "stage": stage, **moved}


@task(
    cache_policy=NO_CACHE,
    name="reconcile-fleet",
    retries=2,
    retry_delay_seconds=RETRY_DELAYS_S,
    retry_condition_fn=outage_only,
)
def reconcile_fleet() -> list[dict[str, Any]]:
    with registry_as(Role.FLEET) as registry:
        return [s.as_dict() for s in reconcile.reconcile_fleet(registry, progress=_progress())]


@task(
    cache_policy=NO_CACHE,
    name="sign-version",
    retries=2,
    retry_delay_seconds=RETRY_DELAYS_S,
    retry_condition_fn=outage_only,
)
def sign_validated(version_id: str) -> bool:
    """Sign a version that passed validation with the pipeline's signing key (signing again
    is a no-op); False, logged, when no key is configured: it cannot reach production."""
    key = signing_key()
    if key is None:
        get_run_logger().warning(f"{version_id} not signed: this worker holds no signing key")
        return False
    with registry_as(Role.SIGNING) as registry:
        signature, created = registry.sign_version(version_id, key)
    _log(f"{version_id} {'signed' if created else 'already signed'} by {signature.key_id}")
    return True


def ui_link(flow_run_id: str) -> str:
    return notify.flow_run_link(Settings(), flow_run_id)


def settings_now() -> Settings:
    return Settings()
