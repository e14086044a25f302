"""Slack notifications against a recording Slack over real HTTP: one message per event with
its facts, off without a token or a channel, a Slack failure returned and never raised,
never posted twice, and the token never shown."""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from dataclasses import dataclass

import pytest

from loragate.registry.settings import Settings
from loragate.tasks import notify as notify_module
from loragate.tasks.notify import (
    Notice,
    NoticeKind,
    awaiting_approval,
    canary_started,
    flow_run_link,
    notify,
    promoted,
    rejected,
    rolled_back,
    stuck,
    traffic_alert,
    undecided,
    validation_failed,
)
from tests.support.slack import Failure, RecordingSlack, slack  # noqa: F401  (the fixture)
from tests.test_layers import ROOT, imported_roots

TOKEN = "xoxb-test-0123456789-secret"
CHANNEL = "#loragate-releases"
NAME = "acme/tiny-llama/support"
V1 = "20261121_101500_0123456789ab"
V2 = "20261122_093000_ba9876543210"
RUN_ID = "5d3f1e9a-7c2b-4c1e-9a55-0f6e2d1b8c47"


def slack_settings(tmp_path, base_url: str | None, **overrides) -> Settings:
    values = {"home": tmp_path, "slack_token": TOKEN, "slack_channel": CHANNEL, "slack_base_url": base_url}
    return Settings(**(values | overrides))


@dataclass(frozen=True)
class Case:
    notice: Notice
    facts: tuple[str, ...]  # each must appear in the text and in the blocks


CASES = {
    NoticeKind.REJECTED: Case(
        rejected(NAME, "manifest_mismatch", "lora_rank", "manifest says rank 8, adapter_config.json says 16"),
        (NAME, "manifest_mismatch", "lora_rank", "rank 8, adapter_config.json says 16"),
    ),
    NoticeKind.VALIDATION_FAILED: Case(
        validation_failed(NAME, V1, ["golden: 2/5 cases passed (needs 80%)", "noop: output equals the base"]),
        (NAME, V1, "golden: 2/5 cases passed", "noop: output equals the base"),
    ),
    NoticeKind.CANARY_STARTED: Case(
        canary_started(NAME, V1, ["http://10.0.0.7:8000"], 86400.0),
        (NAME, V1, "http://10.0.0.7:8000", "1d"),
    ),
    NoticeKind.AWAITING_APPROVAL: Case(
        awaiting_approval(
            NAME, V1, f"http://127.0.0.1:4200/runs/flow-run/{RUN_ID}", "24h in band: 0 errors, drift 0.0"
        ),
        (NAME, V1, f"http://127.0.0.1:4200/runs/flow-run/{RUN_ID}", "0 errors, drift 0.0"),
    ),
    NoticeKind.PROMOTED: Case(promoted(NAME, V2, V1, "alice"), (NAME, V2, V1, "alice")),
    NoticeKind.ROLLED_BACK: Case(
        rolled_back(NAME, "production", V2, V1, "canary drift 0.12 > 0.05", automatic=True),
        (NAME, "production", V2, V1, "canary drift 0.12 &gt; 0.05", "automatic"),
    ),
    NoticeKind.STUCK: Case(
        stuck(NAME, V1, "canary", 5400.0, "started"),
        (NAME, V1, "canary", "1h 30m", "started"),
    ),
    NoticeKind.TRAFFIC_ALERT: Case(
        traffic_alert(NAME, V2, "breaker_open", "http://127.0.0.1:8001", "5 errors in a row <500>"),
        (NAME, V2, "breaker_open", "http://127.0.0.1:8001", "5 errors in a row &lt;500&gt;"),
    ),
    NoticeKind.UNDECIDED: Case(
        undecided(NAME, V2, V1, "live: 40 of 3358 canary requests needed to catch errors 2x production's"),
        (NAME, V2, V1, "40 of 3358 canary requests needed", "larger share"),
    ),
}


def test_every_notice_kind_has_a_case():
    assert set(CASES) == set(NoticeKind)


@pytest.mark.parametrize("kind", list(CASES), ids=str)
def test_each_notice_is_posted_once_to_the_channel_with_its_facts(kind, slack, tmp_path):  # noqa: F811
    case = CASES[kind]
    result = notify(slack_settings(tmp_path, slack.base_url), case.notice)

    assert result.sent and result.error is None and result.kind == kind and result.ts
    [message] = slack.messages
    assert (message.channel, message.authorized, message.answered) == (CHANNEL, True, "ok")
    blocks = json.dumps(message.blocks, ensure_ascii=False)
    for fact in case.facts:
        assert fact in message.text
        assert fact in blocks
    header = message.blocks[0]
    assert header["type"] == "header" and header["text"]["text"].startswith(":")  # an emoji per kind


def test_an_awaiting_approval_notice_links_to_the_paused_flow_run(slack, tmp_path):  # noqa: F811
    settings = slack_settings(tmp_path, slack.base_url, ui_url="https://prefect.example.com/")
    link = flow_run_link(settings, RUN_ID)
    assert link == f"https://prefect.example.com/runs/flow-run/{RUN_ID}"

    notify(settings, awaiting_approval(NAME, V1, link, "in band"))

    [message] = slack.messages
    assert f"<{link}|" in message.text
    assert any(f"<{link}|" in b["text"]["text"] for b in message.blocks if b["type"] == "section")


@pytest.mark.parametrize("unset", ["slack_token", "slack_channel"])
def test_notifications_are_off_without_a_token_or_a_channel(unset, slack, tmp_path, caplog):  # noqa: F811
    caplog.set_level(logging.DEBUG)
    result = notify(slack_settings(tmp_path, slack.base_url, **{unset: None}), CASES[NoticeKind.PROMOTED].notice)

    assert not result.sent and result.error is None
    assert result.off and f"LORAGATE_{unset.upper()}" in result.off
    assert slack.messages == []
    assert TOKEN not in caplog.text


@pytest.mark.parametrize("failure", [Failure.SLACK_ERROR, Failure.HTTP_500], ids=str)
def test_a_slack_refusal_is_returned_not_raised_and_not_retried(failure, slack, tmp_path, caplog):  # noqa: F811
    caplog.set_level(logging.DEBUG)
    slack.fail(failure)
    result = notify(slack_settings(tmp_path, slack.base_url), CASES[NoticeKind.ROLLED_BACK].notice)

    assert not result.sent and result.off is None
    assert result.error and ("channel_not_found" if failure == Failure.SLACK_ERROR else "HTTP 500") in result.error
    assert len(slack.messages) == 1
    assert any(r.name == "loragate.notify" and r.levelno == logging.WARNING for r in caplog.records)
    assert TOKEN not in caplog.text and TOKEN not in repr(result)


def test_a_post_slack_may_have_received_is_never_sent_twice(slack, tmp_path, caplog):  # noqa: F811
    """The connection drops after the post was read: Slack may have posted it, so it is not
    sent again (slack-sdk's default retry handler would)."""
    caplog.set_level(logging.DEBUG)
    slack.fail(Failure.DROP, times=3)
    result = notify(slack_settings(tmp_path, slack.base_url), CASES[NoticeKind.PROMOTED].notice)

    assert not result.sent and result.error
    assert len(slack.messages) == 1
    assert TOKEN not in caplog.text and TOKEN not in repr(result)


def test_an_unreachable_slack_is_returned_not_raised(tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    result = notify(
        slack_settings(tmp_path, f"http://127.0.0.1:{closed_port()}/api/"), CASES[NoticeKind.PROMOTED].notice
    )

    assert not result.sent and result.error and "Connection refused" in result.error
    assert any(r.name == "loragate.notify" and r.levelno == logging.WARNING for r in caplog.records)
    assert TOKEN not in caplog.text and TOKEN not in repr(result)


def test_a_post_slack_never_received_is_sent_again_and_arrives_once(tmp_path):
    """Connection refused: the post cannot have arrived, so it is re-sent once Slack is up."""
    port = closed_port()
    started: list[RecordingSlack] = []
    # up after the first try, before the first re-send (which waits RETRY_DELAYS_S[0])
    delay = notify_module.RETRY_DELAYS_S[0]
    timer = threading.Timer(delay / 2, lambda: started.append(RecordingSlack(port=port)))
    timer.start()
    began = time.monotonic()
    try:
        result = notify(slack_settings(tmp_path, f"http://127.0.0.1:{port}/api/"), CASES[NoticeKind.PROMOTED].notice)
    finally:
        timer.join()
        for server in started:
            server.close()

    assert result.sent
    assert time.monotonic() - began >= delay  # it got there by a re-send
    assert [m.answered for m in started[0].messages] == ["ok"]


def test_hostile_text_cannot_ping_the_channel_or_break_formatting(slack, tmp_path):  # noqa: F811
    notice = rejected("<!channel> a&b", "invalid_manifest", "target_modules", "<@U123> matched <nothing>")
    notify(slack_settings(tmp_path, slack.base_url), notice)

    [message] = slack.messages
    sections = " ".join(b["text"]["text"] for b in message.blocks if b["type"] == "section")
    for mrkdwn in (message.text, sections):
        assert "<!channel>" not in mrkdwn and "<@U123>" not in mrkdwn
        assert "&lt;!channel&gt; a&amp;b" in mrkdwn


def test_an_oversized_notice_still_fits_slacks_block_limits(slack, tmp_path):  # noqa: F811
    failed = [f"check-{i}: " + "x" * 1000 for i in range(50)]
    result = notify(slack_settings(tmp_path, slack.base_url), validation_failed("n" * 300, V1, failed))

    assert result.sent, result.error
    [message] = slack.messages
    assert message.answered == "ok"
    assert "and 40 more" in message.text


def test_the_plain_notifier_imports_without_prefect():
    """Gates and the CLI call ``notify`` directly: importing Prefect costs seconds."""
    assert "prefect" not in imported_roots(ROOT / "loragate" / "tasks" / "notify.py")


def test_the_prefect_task_never_retries_or_caches_a_post():
    """A task-level retry would re-post after a timeout (Slack may have the first) and would
    have to raise -- failing the gate -- to be retried at all."""
    from prefect.cache_policies import NO_CACHE

    from loragate.tasks.notify_task import notify_task

    assert notify_task.retries == 0
    assert notify_task.cache_policy is NO_CACHE


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
