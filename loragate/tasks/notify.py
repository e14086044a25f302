"""Slack notifications: one message per pipeline event a person should see.

A ``Notice`` is what happened -- its kind, the adapter, the version and the facts that
matter for that kind -- built by one constructor per event (``rejected``,
``validation_failed``, ``canary_started``, ``awaiting_approval``, ``promoted``,
``rolled_back``, ``stuck``, ``traffic_alert``) and rendered once into Slack mrkdwn text and
Block Kit blocks. ``notify`` posts it to the configured channel.

Notifications are a side channel, never a gate: they are off while the token or the
channel is unset, and a Slack that refuses or cannot be reached is returned as
``NotifyResult(sent=False, error=...)`` and logged on ``loragate.notify``, never raised.
The token appears in no log line and no result.
"""

from __future__ import annotations

import http.client
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any
from urllib.error import HTTPError, URLError
from uuid import UUID

from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError, SlackClientError
from slack_sdk.http_retry import HttpRequest, HttpResponse, RetryHandler, RetryIntervalCalculator, RetryState

from loragate.registry.settings import Settings, env_var

log = logging.getLogger("loragate.notify")

# one post waits at most this long (connect and read); a gate waits on it
TIMEOUT_S = 10
# pauses before re-sending a post that never reached Slack (see _NeverDelivered)
RETRY_DELAYS_S = (0.5, 2.0)

# Slack's limits (Block Kit): a header holds 150 characters, a section's text 3000; a
# message over them is refused whole (invalid_blocks), so values are clipped instead
_HEADER_MAX = 150
_SECTION_MAX = 3000
_VALUE_MAX = 600
# a list shows its first 10 items at 200 characters each: room left for the other facts
_LIST_MAX = 10
_ITEM_MAX = 200


class NoticeKind(StrEnum):
    REJECTED = "rejected"
    VALIDATION_FAILED = "validation_failed"
    CANARY_STARTED = "canary_started"
    AWAITING_APPROVAL = "awaiting_approval"
    PROMOTED = "promoted"
    ROLLED_BACK = "rolled_back"
    STUCK = "stuck"
    TRAFFIC_ALERT = "traffic_alert"
    UNDECIDED = "undecided"


_HEADLINES = {
    NoticeKind.REJECTED: (":no_entry:", "Rejected at register"),
    NoticeKind.VALIDATION_FAILED: (":x:", "Shadow validation failed"),
    NoticeKind.CANARY_STARTED: (":hatching_chick:", "Canary started"),
    NoticeKind.AWAITING_APPROVAL: (":raised_hand:", "Awaiting approval"),
    NoticeKind.PROMOTED: (":rocket:", "Promoted to production"),
    NoticeKind.ROLLED_BACK: (":rewind:", "Rolled back"),
    NoticeKind.STUCK: (":hourglass:", "Stuck between gates"),
    NoticeKind.TRAFFIC_ALERT: (":rotating_light:", "Live traffic alert"),
    NoticeKind.UNDECIDED: (":grey_question:", "Canary undecided"),
}


@dataclass(frozen=True)
class Notice:
    """One event, ready to post. ``facts`` are (label, mrkdwn) pairs, already escaped."""

    kind: NoticeKind
    name: str
    version_id: str | None
    facts: tuple[tuple[str, str], ...]
    title: str = ""
    link: tuple[str, str] | None = None  # (url, label)

    @property
    def headline(self) -> str:
        emoji, default_title = _HEADLINES[self.kind]
        return _clip(f"{emoji} {self.title or default_title}: {self.name}", _HEADER_MAX)

    def _body(self) -> str:
        lines = [f"*Adapter:* `{_esc(self.name)}`"]
        if self.version_id:
            lines.append(f"*Version:* `{_esc(self.version_id)}`")
        lines += [f"*{label}:* {value}" for label, value in self.facts]
        return _clip("\n".join(lines), _SECTION_MAX)

    def _link(self) -> str | None:
        return f"<{_esc(self.link[0])}|{_esc(self.link[1])}>" if self.link else None

    @property
    def text(self) -> str:
        """The message as mrkdwn: what a notification preview and a client without blocks show."""
        parts = [f"*{_esc(self.headline)}*", self._body(), self._link()]
        return "\n".join(p for p in parts if p)

    @property
    def blocks(self) -> list[dict[str, Any]]:
        blocks: list[dict[str, Any]] = [
            {"type": "header", "text": {"type": "plain_text", "text": self.headline, "emoji": True}},
            {"type": "section", "text": {"type": "mrkdwn", "text": self._body()}},
        ]
        link = self._link()
        if link:
            blocks.append({"type": "section", "text": {"type": "mrkdwn", "text": link}})
        return blocks


# -- the events ---------------------------------------------------------------------------


def rejected(name: str, error_code: str, field: str | None, message: str) -> Notice:
    facts = [("Error", _code(error_code))]
    if field:
        facts.append(("Field", _code(field)))
    facts.append(("Message", _esc(_clip(message, _VALUE_MAX))))
    return Notice(NoticeKind.REJECTED, name, None, tuple(facts))


def validation_failed(name: str, version_id: str, failed_checks: Sequence[str]) -> Notice:
    return Notice(
        NoticeKind.VALIDATION_FAILED,
        name,
        version_id,
        (("Failed checks", f"{len(failed_checks)}\n{_bullets(failed_checks)}"),),
    )


def canary_started(name: str, version_id: str, replicas: Sequence[str], window_s: float) -> Notice:
    return Notice(
        NoticeKind.CANARY_STARTED,
        name,
        version_id,
        (("Replicas", f"{len(replicas)}\n{_bullets(replicas)}"), ("Window", _duration(window_s))),
    )


def awaiting_approval(name: str, version_id: str, ui_url: str, evidence: str) -> Notice:
    quoted = "\n".join(f">{line}" for line in _esc(_clip(evidence, 4 * _VALUE_MAX)).splitlines())
    return Notice(
        NoticeKind.AWAITING_APPROVAL,
        name,
        version_id,
        (("Evidence", f"\n{quoted}"),),
        link=(ui_url, "Review the canary and decide in the Prefect UI"),
    )


def promoted(name: str, version_id: str, previous: str | None, reviewer: str) -> Notice:
    return Notice(
        NoticeKind.PROMOTED,
        name,
        version_id,
        (
            ("Replaces", _code(previous) if previous else "nothing (first production version)"),
            ("Approved by", _esc(reviewer) or "unknown"),
        ),
    )


def rolled_back(
    name: str, stage: str, from_version: str, to_version: str | None, reason: str, automatic: bool
) -> Notice:
    to = _code(to_version) if to_version else f"nothing ({_esc(stage)} cleared)"
    return Notice(
        NoticeKind.ROLLED_BACK,
        name,
        from_version,
        (
            ("Stage", _code(stage)),
            ("Moved", f"{_code(from_version)} → {to}"),
            ("Trigger", "automatic (canary watch)" if automatic else "manual"),
            ("Reason", _esc(_clip(reason, _VALUE_MAX))),
        ),
        title=f"Rolled back {'automatically' if automatic else 'by hand'}",
    )


def undecided(name: str, version_id: str, back_to: str | None, reason: str) -> Notice:
    """A canary window over without the live requests its verdict needs: withdrawn unproven."""
    facts = (
        ("Withdrawn", f"{_code(version_id)}; its users back on {_code(back_to) if back_to else 'the base'}"),
        ("Missing", _esc(_clip(reason, _VALUE_MAX))),
        ("Next", "canary it again with a larger share or a longer window, or more users"),
    )
    return Notice(NoticeKind.UNDECIDED, name, version_id, facts)


def stuck(name: str, version_id: str, gate: str, waited_s: float, action: str) -> Notice:
    facts = (("Waiting for", _code(gate)), ("For", _duration(waited_s)), ("Sweep", _esc(action)))
    return Notice(NoticeKind.STUCK, name, version_id, facts)


def traffic_alert(name: str, version_id: str | None, kind: str, replica: str, detail: str) -> Notice:
    """A replica's split tripped a version's breaker, or fell back too often."""
    facts = (("Alert", _code(kind)), ("Replica", _code(replica)), ("Detail", _esc(_clip(detail, _VALUE_MAX))))
    return Notice(NoticeKind.TRAFFIC_ALERT, name, version_id, facts)


def flow_run_link(settings: Settings, flow_run_id: str | UUID) -> str:
    """The Prefect UI page of a flow run (where a paused run's approval form is)."""
    return f"{settings.ui_url.rstrip('/')}/runs/flow-run/{flow_run_id}"


# -- sending ------------------------------------------------------------------------------


@dataclass(frozen=True)
class NotifyResult:
    sent: bool
    kind: NoticeKind
    channel: str | None = None
    ts: str | None = None  # Slack's id of the posted message
    off: str | None = None  # why notifications are off
    error: str | None = None  # why Slack did not take the message

    def one_line(self) -> str:
        if self.sent:
            return f"{self.kind.value} posted to {self.channel} (ts {self.ts})"
        return f"{self.kind.value} not posted: {self.off or self.error}"


class _Delays(RetryIntervalCalculator):
    def __init__(self, delays: Sequence[float]):
        self.delays = tuple(delays)

    def calculate_sleep_duration(self, current_attempt: int) -> float:
        return self.delays[min(current_attempt, len(self.delays) - 1)]


class _NeverDelivered(RetryHandler):
    """Re-send a post only when Slack cannot have received it.

    chat.postMessage is not idempotent: a post that reached Slack and then timed out or
    lost its connection may well be in the channel, and sending it again doubles it.
    urllib wraps in ``URLError`` exactly the failures of connecting and writing the
    request (refused, DNS, connect timeout); a failure while waiting for the answer comes
    unwrapped, and an HTTP status as ``HTTPError``. slack-sdk's own default handler also
    retries resets and disconnects after the request was sent, so it is replaced.
    """

    def _can_retry(
        self,
        *,
        state: RetryState,
        request: HttpRequest,
        response: HttpResponse | None = None,
        error: Exception | None = None,
    ) -> bool:
        return response is None and isinstance(error, URLError) and not isinstance(error, HTTPError)


def notify(settings: Settings, notice: Notice) -> NotifyResult:
    """Post ``notice`` to the configured Slack channel; never raises for Slack's sake."""
    token, channel = settings.slack_token, settings.slack_channel
    if not token or not channel:
        unset = [env_var(f) for f, v in (("slack_token", token), ("slack_channel", channel)) if not v]
        result = NotifyResult(
            sent=False, kind=notice.kind, off=f"Slack notifications are off: {', '.join(unset)} unset"
        )
        log.debug("%s: %s", notice.name, result.one_line())
        return result
    # slack-sdk joins the method name onto the base URL: without the trailing slash the
    # last path segment (/api) would be replaced
    base_url = (settings.slack_base_url or WebClient.BASE_URL).rstrip("/") + "/"
    client = WebClient(
        token=token,
        base_url=base_url,
        timeout=TIMEOUT_S,
        retry_handlers=[
            _NeverDelivered(max_retry_count=len(RETRY_DELAYS_S), interval_calculator=_Delays(RETRY_DELAYS_S))
        ],
    )
    try:
        response = client.chat_postMessage(channel=channel, text=notice.text, blocks=notice.blocks)
    except SlackApiError as e:
        # {"ok": false, "error": "channel_not_found"}, or a non-JSON error page summarized
        error = f"Slack refused the message: HTTP {e.response.status_code}, {_clip(str(e.response.get('error')), 200)}"
    except (SlackClientError, OSError, http.client.HTTPException, ValueError) as e:
        # OSError covers refused, reset, timed out (URLError is one); ValueError is urllib's
        # answer to a malformed base URL
        error = f"no answer from Slack at {base_url}: {type(e).__name__}: {e}"
    else:
        result = NotifyResult(
            sent=True, kind=notice.kind, channel=response.get("channel") or channel, ts=response.get("ts")
        )
        log.info("%s: %s", notice.name, result.one_line())
        return result
    # a token can come back inside an echoed request or a proxy's error page
    result = NotifyResult(sent=False, kind=notice.kind, channel=channel, error=error.replace(token, "[token]"))
    log.warning("%s: %s", notice.name, result.one_line())
    return result


# -- rendering helpers ---------------------------------------------------------------------


def _esc(text: str) -> str:
    # the three characters Slack reserves in mrkdwn; escaping < also keeps an adapter name
    # or an error message from pinging <!channel>
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _code(text: str) -> str:
    return f"`{_esc(_clip(text, _VALUE_MAX))}`"


def _bullets(items: Sequence[str]) -> str:
    lines = [f"• {_esc(_clip(i, _ITEM_MAX))}" for i in items[:_LIST_MAX]]
    if len(items) > _LIST_MAX:
        lines.append(f"• … and {len(items) - _LIST_MAX} more")
    return "\n".join(lines)


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:g}s"
    whole = round(seconds)
    parts = [(whole // 86400, "d"), (whole % 86400 // 3600, "h"), (whole % 3600 // 60, "m"), (whole % 60, "s")]
    return " ".join(f"{n}{unit}" for n, unit in parts if n)
