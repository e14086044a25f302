"""The canary's moves -- put on canary, withdraw, promote -- one function each, for every
caller: the Prefect gates, the scheduled watch and the shell (``loragate promote --to
canary``, ``loragate rollback --stage canary``) run the same code, so a canary opened or
withdrawn from a terminal is evaluated and withdrawn exactly as the pipeline's.

``deploy_canary`` puts the version on the canary replicas (a switch, verified), opens its
window at share 0, warms it on every production replica as ``name@version`` (verified the
same way) and only then gives it its share of live requests (``tasks/traffic.py``): users
never reach a version that was not loaded and checked where they are served.

A withdrawal sends 0 % to the canary first (pushed to every replica), then moves the pointer
back, unloads its warm copy and closes its window; a promotion sends 100 % to the warm canary
first, then moves production, then keeps the replaced version warm as ``name@version`` so a
rollback only moves traffic. A promotion that does not commit has the split put back (and
pushed) by the fleet switch's one undo, after its replicas (``tasks/fleet.py``). Each move
unloads the warm copies it leaves behind once it commits (``tasks/warm_copies.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from loragate.registry.errors import (
    DeployFailed,
    ErrorCode,
    IllegalTransition,
    InvalidInput,
    LoragateError,
)
from loragate.registry.progress import Progress, quiet
from loragate.registry.records.adapters import utcnow
from loragate.registry.rules.canary import ACTIVE, CanaryWindow, WindowStatus
from loragate.registry.rules.lifecycle import Plan
from loragate.registry.rules.names import AdapterName
from loragate.registry.rules.power import Coverage, ramped_share
from loragate.registry.service import Registry
from loragate.tasks.fleet import AheadOfTheMove, promote_and_switch, rollback_and_switch
from loragate.tasks.routes import push_routes, stage_replicas
from loragate.tasks.traffic import cool_version, warm_version

# what the shell's withdrawal records where the operator gave no reason
SHELL_WITHDRAWAL = "withdrawn from the shell (loragate rollback --stage canary)"


# -- deploy ------------------------------------------------------------------------------


@dataclass(frozen=True)
class CanaryDeployment:
    # None where another canary replaced this one before its window opened (``deploy_canary``)
    window: CanaryWindow | None
    created: bool
    replicas: list[dict[str, Any]]
    plan: Plan


def deploy_canary(
    registry: Registry, version_id: str, progress: Progress = quiet, *, reason: str | None = "canary gate"
) -> CanaryDeployment:
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
    plan, report = promote_and_switch(registry, version_id, "canary", reason=reason, progress=progress)
    try:
        window, created = registry.open_canary_window(version_id, share=0.0)
    except IllegalTransition:
        if registry.get_adapter(version.name).canary == version_id:
            raise
        progress(f"{version.name}: {version_id} was replaced as the canary before its window opened")
        return CanaryDeployment(None, False, report, plan)
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
    return CanaryDeployment(window, created, report, plan)


def put_on_canary(
    registry: Registry, version_id: str, *, reason: str | None = None, progress: Progress = quiet
) -> CanaryDeployment | tuple[Plan, list[dict[str, Any]]]:
    """``loragate promote VERSION --to canary``: where the version's base has replicas, the
    canary gate's own ``deploy_canary`` (its window opened, its live split given its share);
    a registry with no replica for the base has nothing to serve or split, so the pointer
    alone moves (its plan and the empty report).

    Raises: as ``deploy_canary``, or as ``promote_and_switch`` without replicas.
    """
    name = registry.get_version(version_id).name
    if not registry.list_replicas(AdapterName.parse(name).base):
        return promote_and_switch(registry, version_id, "canary", reason=reason, progress=progress)
    return deploy_canary(registry, version_id, progress, reason=reason)


# -- ramp ----------------------------------------------------------------------------------


def ramp_canary(
    registry: Registry,
    window: CanaryWindow,
    covered: Coverage,
    production: tuple[int, int],
    progress: Progress = quiet,
) -> CanaryWindow | None:
    """Raise a running window's share when its traffic will not bring the live requests its
    verdict needs by its end (``rules/power.py``), never past the window's
    ``max_auto_share``; audited as a share change with the need and the pace, pushed to every
    replica. ``production``: (requests, errors) production answered in the window. Returns
    the window as raised, or None where no raise is due or the registry refused it (the
    database's cap lower than the setting's, the window ended meanwhile): a ramp never fails
    the evaluation it follows."""
    now = utcnow()
    elapsed = (now - window.opened_at).total_seconds()
    remaining = (window.ends_at - now).total_seconds()
    t = window.thresholds
    share = ramped_share(t.detection, covered, production[0], production[1], elapsed, remaining, t.max_auto_share)
    if share is None:
        return None
    reason = f"auto-ramp {covered.share:.2%} -> {share:.2%} (cap {t.max_auto_share:.2%}): {covered.describe()}"
    try:
        raised = registry.set_canary_share(window.id, share, reason=reason[:200])
    except LoragateError as e:
        # the database's cap below the setting's, or the window ended meanwhile: the
        # evaluation stands, the window goes on at its share and says so when it ends
        progress(f"{window.adapter_name} {window.version_id}: not ramped ({e.one_line()})")
        return None
    push_routes(registry, window.adapter_name, progress)
    progress(f"{window.adapter_name} {window.version_id}: {reason}")
    return raised


# -- withdraw ------------------------------------------------------------------------------


def withdraw_from_canary(
    registry: Registry, name: str, version_id: str, reason: str, progress: Progress = quiet
) -> tuple[Plan, list[dict[str, Any]]]:
    """The canary replicas go back to production's version (or drop the name), the warm copy
    on production is unloaded and the version becomes ``rolled_back`` with the reason --
    unless it is no longer the canary (decided under the adapter's lock), so a repeat after
    a crash moves nothing and a version that replaced it meanwhile is never withdrawn by this
    decision. Returns the move's plan and the replicas' report."""
    push_routes(registry, name, progress)  # a closed window's canary gets no traffic from here on
    moved = rollback_and_switch(registry, name, "canary", reason=reason, expected_version=version_id, progress=progress)
    cool_version(registry, name, version_id, progress)
    return moved


def _withdraw(
    registry: Registry, window: CanaryWindow, reason: str, progress: Progress
) -> tuple[CanaryWindow, Plan, list[dict[str, Any]]]:
    current = registry.canary_window(window.id)
    if current.status in ACTIVE and current.share > 0:
        registry.set_canary_share(window.id, 0.0, reason=reason[:200])
    plan, report = withdraw_from_canary(registry, window.adapter_name, window.version_id, reason, progress)
    # the move ended the window (rolled_back) in its own transaction, as a move that took the
    # canary away meanwhile ended it its own way; one still active outlived its canary
    # (a registry from before that rule) and nothing else will end it
    after = registry.canary_window(window.id)
    if after.status in ACTIVE:
        after = registry.close_canary_window(window.id, WindowStatus.ROLLED_BACK, reason)
    return after, plan, report


def withdraw_canary(registry: Registry, window: CanaryWindow, reason: str, progress: Progress = quiet) -> CanaryWindow:
    """Auto-rollback: the canary gets 0 % of live traffic on every replica at once, then is
    withdrawn, and its window closes ``rolled_back`` -- unless its verdict ended it already:
    ``undecided``, over without the live requests its verdict needs (the version withdrawn
    unproven, not failed: it may be canaried again with more traffic or a longer window)."""
    closed, _, _ = _withdraw(registry, window, reason, progress)
    return closed


def withdraw_adapter_canary(
    registry: Registry, name: str, *, reason: str | None = None, progress: Progress = quiet
) -> tuple[Plan, list[dict[str, Any]], CanaryWindow | None]:
    """``loragate rollback NAME --stage canary``: the adapter's canary withdrawn as the watch
    withdraws it (``withdraw_canary``) where it has an active window -- 0 % on every replica
    before the pointer moves, its warm copy unloaded, its window closed ``rolled_back`` -- and
    moved back (``withdraw_from_canary``) where it has none. Returns (plan, replicas' report,
    the closed window or None).

    Raises:
        NotFound: no such adapter.
        IllegalTransition: the adapter has no canary to withdraw.
        PermissionDenied: the caller may not withdraw this adapter's canary.
        DeployFailed: a replica could not be switched (the pointer did not move).
    """
    why = reason or SHELL_WITHDRAWAL
    canary = registry.get_adapter(name).canary
    window = registry.active_canary_window(name) if canary is not None else None
    if canary is None or window is None or window.version_id != canary:
        # no canary: the rollback's own refusal; a canary with no live window has no split
        plan, report = rollback_and_switch(registry, name, "canary", reason=reason, progress=progress)
        if canary is not None:
            cool_version(registry, name, canary, progress)
        return plan, report, None
    closed, plan, report = _withdraw(registry, window, why, progress)
    return plan, report, closed


# -- promote -------------------------------------------------------------------------------


def promote_canary(
    registry: Registry,
    version_id: str,
    reason: str,
    progress: Progress = quiet,
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

    def send(share: float, why: str) -> None:
        registry.set_canary_share(name, share, reason=why)
        push_routes(registry, name, progress)

    # every user to the warm canary just before the move (its copies made ready), so the
    # switch moves no user's traffic -- only on a person's sign-off pending (or as the owner):
    # without one the switch moves them. Undone by the switch's revert, after the replicas,
    # should the move not commit.
    all_users_first = (
        AheadOfTheMove(
            make=lambda: send(1.0, "promotion: all live traffic to the canary"),
            undo=lambda: send(share_before, "promotion failed: the split as it was"),
        )
        if 0 < share_before < 1 and registry.canary_share_allowed(window, 1.0)
        else None
    )
    _, report = promote_and_switch(
        registry,
        version_id,
        "production",
        reason=reason,
        progress=progress,
        acknowledge_scan_review=acknowledge_scan_review,
        ahead=all_users_first,
    )
    closed = registry.canary_window(window.id)  # the move ended it: promoted
    push_routes(registry, name, progress)
    keep_previous_warm(registry, name, previous, progress)
    return closed, previous, report


def promote_to_production(
    registry: Registry,
    version_id: str,
    *,
    reason: str | None = None,
    acknowledge_scan_review: bool = False,
    progress: Progress = quiet,
    override: bool = False,
) -> tuple[Plan, list[dict[str, Any]], CanaryWindow | None]:
    """``loragate promote VERSION --to production``: a person's own move (``promote_and_switch``),
    which ends the version's active canary window in its transaction as the gate's promotion
    does -- a ready window ``promoted``; one still observing ``superseded``, only on that
    person's explicit ``override`` with a reason (promoted before its window decided).
    Returns (plan, replicas' report, the window the move ended, or None where it ended none).

    Raises: as ``promote_and_switch``.
    """
    active = registry.canary_windows(version_id=version_id)
    plan, report = promote_and_switch(
        registry,
        version_id,
        "production",
        reason=reason,
        progress=progress,
        acknowledge_scan_review=acknowledge_scan_review,
        override=override,
    )
    ended = registry.canary_window(active[-1].id) if active and not plan.empty else None
    return plan, report, ended if ended is not None and ended.status not in ACTIVE else None


def keep_previous_warm(registry: Registry, name: str, previous: str | None, progress: Progress = quiet) -> None:
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
