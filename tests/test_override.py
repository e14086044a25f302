"""A person's promotion of a canary whose window has not decided: refused unless it says it
is an override, with a reason, which the audit log, the ended window and the Prefect event
feed all carry (the moves that end a window otherwise: tests/test_canary.py)."""

from __future__ import annotations

import pytest

from loragate.registry.errors import ErrorCode, LoragateError
from loragate.registry.rules.canary import WindowStatus
from tests import test_canary
from tests.support.moves import promote
from tests.support.registries import registry_snapshot
from tests.test_canary import run_cli

canaried = test_canary.canaried  # the fixture: two validated versions, the first in canary


@pytest.mark.parametrize(
    ("override", "reason", "refused_as"),
    [
        (False, None, ErrorCode.OVERRIDE_REQUIRED),
        (False, "because I say so", ErrorCode.OVERRIDE_REQUIRED),  # a reason alone is no override
        (True, None, ErrorCode.ILLEGAL_TRANSITION),  # an override says why
        (True, "   ", ErrorCode.ILLEGAL_TRANSITION),
    ],
)
def test_production_past_a_window_still_observing_takes_an_explicit_override_and_a_reason(
    canaried, override, reason, refused_as
):
    registry, name, v1, _ = canaried
    w, _ = registry.open_canary_window(v1)
    before = registry_snapshot(registry.settings)
    with pytest.raises(LoragateError) as refused:
        promote(registry, v1, "production", reason=reason, override=override)
    assert refused.value.code == refused_as
    assert registry_snapshot(registry.settings) == before  # nothing moved, the window still observes
    assert registry.canary_window(w.id).status == WindowStatus.OPEN


def test_an_override_is_in_the_audit_with_its_reason_and_ends_the_window_superseded_saying_so(canaried):
    registry, name, v1, _ = canaried
    w, _ = registry.open_canary_window(v1)
    promote(registry, v1, "production", reason="incident 4711 needs the fix", override=True)
    assert registry.get_adapter(name).production == v1
    moved = [e for e in registry.history(name) if e.action == "promote" and e.to_value == v1][-1]
    assert moved.reason == "override: incident 4711 needs the fix" and moved.details["override"] is True
    closed = registry.canary_window(w.id)
    assert closed.status == WindowStatus.SUPERSEDED and closed.reason == "override: incident 4711 needs the fix"


def test_promote_override_on_the_command_line_says_why_in_the_audit_and_on_the_prefect_feed(
    canaried, monkeypatch, capsys
):
    from loragate.flows import events

    registry, name, v1, _ = canaried
    w, _ = registry.open_canary_window(v1)
    sent: list[dict] = []
    monkeypatch.setattr(events, "emit_event", lambda **kw: sent.append(kw))  # caught before it leaves
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")
    before = registry_snapshot(registry.settings)
    assert run_cli(registry, monkeypatch, "promote", v1, "--to", "production", "--reason", "now") == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].startswith("error: override_required")
    assert run_cli(registry, monkeypatch, "promote", v1, "--to", "production", "--override") == 2
    assert "[reason]" in capsys.readouterr().err
    assert registry_snapshot(registry.settings) == before and sent == []
    argv = ("promote", v1, "--to", "production", "--override", "--reason", "incident 4711")
    assert run_cli(registry, monkeypatch, *argv) == 0
    assert registry.get_adapter(name).production == v1
    assert registry.canary_window(w.id).status == WindowStatus.SUPERSEDED
    (event,) = sent
    assert event["event"] == events.CANARY_OVERRIDDEN
    assert event["payload"] == {"name": name, "version_id": v1, "window_id": w.id, "reason": "incident 4711"}
