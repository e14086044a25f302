"""``loragate canary share`` and the traffic alerts ``loragate status`` lists.

``canary share NAME SHARE`` changes the share of the adapter's live requests its running
canary answers: a fraction (``0.1``) or a percentage (``10%``). A share above 0 warms the
canary on every production replica first if it is not warm there yet; then the replicas
are told to read the routing table at once (``tasks/traffic.py``). A share that is not a
number from 0 to 1 is refused before anything is read or changed (exit 2, one line
naming ``share``); a share above ``LORAGATE_CANARY_MAX_SHARE`` is refused the same way as a
permission (exit 3, ``share_above_cap``) unless a person's sign-off of the canary is
redeemed and waits for its promotion.

``canary feedback REQUEST_ID accepted|retried`` feeds "task completion": the id is the
``x-loragate-request-id`` header of an answer, signed by the replica that gave it; a
production replica of the adapter checks the signature and counts it once for the version
that answered.

Traffic alerts -- a tripped breaker, a replica falling back too often -- are audit records
(``traffic_alert``); ``status`` shows those of the last 15 minutes as ``ALERT`` lines.
"""

from __future__ import annotations

import argparse
from datetime import timedelta
from typing import Any

from loragate.cli.output import EXIT_OK, emit, open_registry, progress_printer
from loragate.registry.rules.share import parse_share
from loragate.registry.rules.text import check_text

# what ``status`` shows: the alerts' own dedupe window, so each alert shows once
RECENT_ALERTS = timedelta(minutes=15)


def cmd_canary_share(args: argparse.Namespace) -> int:
    share = parse_share(args.share)
    check_text(args.reason, field="reason")
    from loragate.tasks.traffic import set_share  # the replicas' client: only when a share changes

    with open_registry(args) as reg:
        before = reg.check_canary_share(args.name, share)  # the share it replaces
        window = set_share(reg, args.name, share, reason=args.reason, progress=progress_printer(args))
    was = before.share if before.id == window.id else None
    emit(
        args,
        {**window.as_dict(), "previous_share": was},
        f"{window.adapter_name}: canary window {window.id} ({window.version_id}, {window.status.value}) "
        f"answers {window.share:.2%} of live requests" + ("" if was is None else f" (was {was:.2%})"),
    )
    return EXIT_OK


def cmd_canary_feedback(args: argparse.Namespace) -> int:
    from loragate.tasks.traffic import check_feedback, send_feedback  # the replicas' client: only here

    check_feedback(args.request_id, args.outcome)  # refused before anything is opened
    with open_registry(args) as reg:
        answer = send_feedback(reg, args.request_id, args.outcome)
    emit(
        args,
        answer,
        f"{answer.get('adapter')} {answer.get('version')}: {args.outcome} "
        + ("counted" if answer.get("counted") else "already counted")
        + f" (replica {answer.get('replica')})",
    )
    return EXIT_OK


def recent_alerts(reg: Any) -> list[dict[str, Any]]:
    """The traffic alerts recorded in the last 15 minutes, oldest first."""
    from loragate.registry.records.adapters import utcnow  # pydantic records: only once the registry is open

    return list(reg.traffic_alerts(utcnow() - RECENT_ALERTS))


def alert_line(alert: dict[str, Any]) -> str:
    """``ALERT <kind> <adapter> [<version>] [on <replica>] at <time>: <detail>``, one line."""
    parts = ["ALERT", str(alert.get("kind")), str(alert.get("name"))]
    if alert.get("version_id"):
        parts.append(str(alert["version_id"]))
    if alert.get("replica"):
        parts.append(f"on {alert['replica']}")
    parts.append(f"at {alert.get('at')}")
    detail = " ".join(str(alert.get("detail") or "").split())  # one line, whatever the replica said
    return "\t".join(parts) + (f": {detail[:300]}" if detail else "")


def add_canary_commands(canary: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = canary.add_parser(
        "share", parents=[common], help="change the share of live requests the adapter's running canary answers"
    )
    p.add_argument("name", help="the adapter, namespace/base/task")
    p.add_argument("share", help="a fraction from 0 to 1 (0.1) or a percentage (10%%); 0: probes only")
    p.add_argument("--reason", help="why (recorded in the audit log)")
    p.set_defaults(func=cmd_canary_share)
    p = canary.add_parser(
        "feedback", parents=[common], help="tell loragate whether a user accepted an answer or asked again"
    )
    p.add_argument("request_id", help="the answer's x-loragate-request-id header")
    p.add_argument("outcome", help="accepted or retried")
    p.set_defaults(func=cmd_canary_feedback)
