"""``loragate status``, ``approve``, ``canary`` and ``training-completed``: the promotion
pipeline from a shell.

``status`` lists the versions waiting between gates, and for how long. ``approve`` resumes
the very pause the ``promote`` flow run waits in -- the one the Prefect UI shows as a form --
with the same fields and an approval code it issues to the caller's own activation token;
the flow redeems the code and records the decision. ``approve-code`` issues such a code
alone, for a person to type into the UI's form (``--rollback``: for the rollback
deployment's ``code`` parameter). ``canary`` shows windows and their observations from the
registry. ``training-completed`` emits the event a training job emits, which starts the
pipeline.
"""

from __future__ import annotations

import argparse
from uuid import UUID

from loragate.cli.output import EXIT_OK, emit, open_registry
from loragate.cli.traffic import add_canary_commands, alert_line, recent_alerts
from loragate.registry.errors import ErrorCode, IllegalTransition, InvalidInput, PermissionDenied, Unavailable
from loragate.registry.intake.jsonio import loads_object
from loragate.registry.rules.access import Action


def _waiting_window(reg, version: str):
    """The version's window, when a promote run waits for its sign-off.

    Raises:
        IllegalTransition: the window is not waiting for a sign-off.
        InvalidInput: ILLEGAL_TRANSITION, no promote run has paused for it yet.
    """
    from loragate.registry.rules.canary import WindowStatus

    window = reg.latest_canary_window(version)
    if window.status != WindowStatus.READY:
        raise IllegalTransition(
            f"{version}'s canary window is {window.status.value}: there is no sign-off to give", field="version"
        )
    if window.approval_flow_run_id is None:
        raise InvalidInput(
            f"no promotion waits for a sign-off of {version} yet (the promote flow run has not paused)",
            code=ErrorCode.ILLEGAL_TRANSITION,
            field="version",
        )
    return window


def cmd_approve_code(args: argparse.Namespace) -> int:
    from loragate.registry.rules.approvals import Decision

    if args.reject and args.rollback:
        raise InvalidInput("--reject and --rollback are two different decisions: give one", field="rollback")
    decision = Decision.ROLLBACK if args.rollback else Decision.of(not args.reject)
    with open_registry(args) as reg:
        waiting = None if args.rollback else _waiting_window(reg, args.version).approval_flow_run_id
        record, code = reg.issue_approval_code(args.version, decision=decision, ttl_s=args.ttl)
    until = record.expires_at.strftime("%Y-%m-%d %H:%M:%S UTC")
    emit(
        args,
        {**record.as_dict(), "code": code, "flow_run_id": waiting},
        f"approval code to {record.decision.value} {args.version} as {record.reviewer}, "
        f"good once until {until} (shown once):\n{code}",
    )
    return EXIT_OK


def cmd_approve(args: argparse.Namespace) -> int:
    from loragate.registry.rules.approvals import Decision
    from loragate.registry.rules.lifecycle import check_scan_acknowledged

    with open_registry(args) as reg:
        window = _waiting_window(reg, args.version)
        # the caller signs off as the holder of their own activation token, nobody else
        reg.principal.require(Action.APPROVE, window.adapter_name)
        holder = reg.principal.holder
        if args.reviewer is not None and args.reviewer.strip() != holder:
            raise PermissionDenied(
                f"your token is {holder or 'no one'}'s: you sign off as {holder or 'no one'}, "
                f"not as {args.reviewer.strip()!r}: nothing was moved",
                field="reviewer",
            )
        review = reg.scan_under_review(args.version)
        if not args.reject:
            check_scan_acknowledged(
                args.version, review.describe() if review else None, acknowledged=args.acknowledge_scan_review
            )
        record, code = reg.issue_approval_code(args.version, decision=Decision.of(not args.reject))
    # Prefect costs ~2 s to import: only the command that talks to it pays
    import httpx
    from prefect.exceptions import FlowPauseTimeout, NotPausedError, ObjectNotFound
    from prefect.flow_runs import resume_flow_run
    from prefect.settings import PREFECT_UI_URL

    run_id = window.approval_flow_run_id
    decision = {
        "approve": not args.reject,
        "reviewer": record.reviewer,
        "comment": args.comment,
        "acknowledge_scan_review": args.acknowledge_scan_review,
    }
    try:
        resume_flow_run(UUID(run_id), run_input={**decision, "code": code})
    except (NotPausedError, FlowPauseTimeout, ObjectNotFound) as e:
        raise InvalidInput(
            f"flow run {run_id} no longer waits for a sign-off of {args.version} ({type(e).__name__})",
            code=ErrorCode.ILLEGAL_TRANSITION,
            field="version",
        ) from e
    except (httpx.HTTPError, OSError, RuntimeError) as e:
        raise Unavailable(f"the Prefect API could not resume flow run {run_id}: {e}", field="PREFECT_API_URL") from e
    ui = PREFECT_UI_URL.value()
    link = f"{ui.rstrip('/')}/runs/flow-run/{run_id}" if ui else run_id
    verb = "approved" if decision["approve"] else "rejected"
    emit(
        args,
        {
            "version_id": args.version,
            "flow_run_id": run_id,
            "window_id": window.id,
            "approval_code": record.code_id,
            "token_id": record.token_id,
            **decision,
        },
        f"{verb} {args.version} as {record.reviewer} (approval code {record.code_id}, "
        f"token {record.token_id}); the promote run resumes: {link}",
    )
    return EXIT_OK


def _window_lines(reg, windows) -> str:
    lines = []
    for w in windows:
        observations = reg.canary_observations(w.id)
        last = observations[-1] if observations else None
        verdict = f"\t{last.verdict.value}: {'; '.join(last.reasons)}" if last else ""
        lines.append(
            f"{w.id}\t{w.adapter_name}\t{w.version_id}\t{w.status.value}\t{len(observations)} observation(s){verdict}"
        )
    return "\n".join(lines) or "(no canary windows)"


def cmd_canary_list(args: argparse.Namespace) -> int:
    from loragate.registry.rules.canary import ACTIVE

    with open_registry(args) as reg:
        windows = reg.canary_windows(None if args.all else ACTIVE)
        text = _window_lines(reg, windows)
    emit(args, [w.as_dict() for w in windows], text)
    return EXIT_OK


def cmd_status(args: argparse.Namespace) -> int:
    """Every version waiting between gates, and for how long: what the ``advance`` sweep
    acts on (after LORAGATE_ADVANCE_AFTER_S) and reports (after LORAGATE_STUCK_ALERT_S);
    then the traffic alerts of the last 15 minutes."""
    with open_registry(args) as reg:
        waiting = reg.waiting(longer_than_s=args.longer_than)
        alert_s = reg.settings.stuck_alert_s
        alerts = recent_alerts(reg)
    from loragate.registry.records.adapters import utcnow  # pydantic records: imported by the registry already

    now = utcnow()

    def lines() -> str:
        shown = [
            f"{w.version_id}\t{w.adapter_name}\twaits for {w.gate.value}\t{w.waited_s(now):.0f}s"
            + ("\tSTUCK" if w.waited_s(now) >= alert_s else "")
            for w in waiting
        ] or ["no version waits between gates"]
        return "\n".join(shown + [alert_line(a) for a in alerts])

    emit(
        args,
        {"waiting": [{**w.as_dict(now), "stuck": w.waited_s(now) >= alert_s} for w in waiting], "alerts": alerts},
        lines,
    )
    return EXIT_OK


def cmd_canary_show(args: argparse.Namespace) -> int:
    from loragate.registry.render.canary import canary_evidence_markdown

    with open_registry(args) as reg:
        window = reg.latest_canary_window(args.version)
        observations = reg.canary_observations(window.id)
    emit(
        args,
        {**window.as_dict(), "observations": [o.as_dict() for o in observations]},
        lambda: canary_evidence_markdown(window, observations),
    )
    return EXIT_OK


def cmd_training_completed(args: argparse.Namespace) -> int:
    training = (
        loads_object(args.metadata, what="--metadata", code=ErrorCode.INVALID_MANIFEST, field="metadata")
        if args.metadata
        else {}
    )
    from prefect.events.worker import EventsWorker

    from loragate.flows.events import announce_training_completed

    announce_training_completed(args.bundle, args.name, training, args.golden_set)
    EventsWorker.drain_all(timeout=30, at_exit=False)  # sent before the command returns
    emit(
        args,
        {"event": "loragate.training.completed", "bundle": args.bundle, "name": args.name, "training": training},
        f"emitted loragate.training.completed for {args.name} ({args.bundle})",
    )
    return EXIT_OK


def add_commands(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("approve", parents=[common], help="sign a canary off (resumes the paused promote run)")
    p.add_argument("version")
    p.add_argument(
        "--reviewer", help="who decides: the holder of your token (given, it must match; recorded in the audit log)"
    )
    p.add_argument("--reject", action="store_true", help="reject instead: the canary is withdrawn")
    p.add_argument("--comment", default="", help="why (recorded in the audit log)")
    p.add_argument(
        "--acknowledge-scan-review",
        action="store_true",
        help="approve a version whose weight scan asked for review (recorded in the audit log)",
    )
    p.set_defaults(func=cmd_approve)

    p = sub.add_parser(
        "approve-code",
        parents=[common],
        help="a single-use code proving your sign-off, for the Prefect UI's form (your own activation token)",
    )
    p.add_argument("version")
    p.add_argument("--reject", action="store_true", help="a code to reject instead")
    p.add_argument(
        "--rollback",
        action="store_true",
        help="a code to roll back the stage serving VERSION, for the rollback deployment's `code` parameter",
    )
    p.add_argument("--ttl", type=float, help="seconds the code stays good (default LORAGATE_APPROVAL_CODE_TTL_S)")
    p.set_defaults(func=cmd_approve_code)

    p = sub.add_parser(
        "status", parents=[common], help="versions waiting between gates, for how long, and recent traffic alerts"
    )
    p.add_argument("--longer-than", type=float, default=0.0, metavar="S", help="only those waiting at least S seconds")
    p.set_defaults(func=cmd_status)

    canary = sub.add_parser("canary", help="canary windows and their observations").add_subparsers(
        dest="canary_command", required=True
    )
    p = canary.add_parser("list", parents=[common], help="active canary windows")
    p.add_argument("--all", action="store_true", help="closed ones too")
    p.set_defaults(func=cmd_canary_list)
    p = canary.add_parser("show", parents=[common], help="a version's canary window and evidence")
    p.add_argument("version")
    p.set_defaults(func=cmd_canary_show)
    add_canary_commands(canary, common)

    p = sub.add_parser(
        "training-completed", parents=[common], help="emit loragate.training.completed (starts the pipeline)"
    )
    p.add_argument("bundle", help="the bundle: a directory or s3://bucket/prefix")
    p.add_argument("--name", required=True, help="the logical adapter name, namespace/base/task")
    p.add_argument("--metadata", help="training metadata, a JSON object")
    p.add_argument("--golden-set", help="a golden set (JSONL) to attach to the adapter with this version")
    p.set_defaults(func=cmd_training_completed)
