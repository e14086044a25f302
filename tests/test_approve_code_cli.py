"""``loragate approve-code``: a person's activation token gets an approval code for a
version, shown once. Bad input -- a lifetime out of range, two decisions, a version never
canaried, a rollback of what no stage serves, a training token, another namespace -- is
refused in one line and issues nothing; the code shown proves the sign-off
(``test_approvals.py``). SQLite and Postgres alike."""

from __future__ import annotations

import json

import pytest

from loragate.registry.rules.canary import WindowStatus
from tests import test_approvals
from tests.test_approvals import SignOff

# test_approvals' fixture: a version on canary, its window ready, its sign-off pending
signoff = test_approvals.signoff


def approve_code_cli(s: SignOff, monkeypatch, capsys, who: str, *argv: str) -> tuple[int, str, list[str]]:
    from loragate.cli.main import main

    monkeypatch.setenv("LORAGATE_DATABASE_URL", s.owner.settings.database_url)
    monkeypatch.setenv("LORAGATE_ARTIFACTS", s.owner.settings.artifacts)
    monkeypatch.setenv("LORAGATE_TOKEN", s.tokens[who])
    capsys.readouterr()
    rc = main(["approve-code", *argv])
    out, err = capsys.readouterr()
    return rc, out, err.strip().splitlines()


@pytest.mark.parametrize(
    "who, argv, rc, code",
    [
        ("alice", ["{v1}", "--ttl", "5"], 2, "invalid_setting"),
        ("alice", ["{v1}", "--reject", "--rollback"], 2, "invalid_manifest"),
        ("alice", ["{v2}"], 2, "not_found"),
        ("alice", ["{v2}", "--rollback"], 2, "illegal_transition"),
        ("trainer", ["{v1}"], 3, "permission denied"),
        ("elsewhere", ["{v1}"], 3, "permission denied"),
    ],
    ids=["ttl-too-short", "two-decisions", "never-canaried", "rollback-of-what-nothing-serves", "trainer", "namespace"],
)
def test_approve_code_refuses_bad_input_in_one_line_and_issues_nothing(
    signoff, monkeypatch, capsys, who, argv, rc, code
):
    args = [a.format(v1=signoff.v1, v2=signoff.v2) for a in argv]
    got, _, err = approve_code_cli(signoff, monkeypatch, capsys, who, *args)
    assert got == rc and len(err) == 1 and code in err[0], err
    assert signoff.owner.approval_codes(signoff.window_id) == []


def test_approve_code_shows_the_code_once_and_it_proves_the_sign_off(signoff, monkeypatch, capsys):
    rc, out, _ = approve_code_cli(signoff, monkeypatch, capsys, "alice", signoff.v1, "--json")
    shown = json.loads(out)
    assert rc == 0 and shown["reviewer"] == "alice" and shown["decision"] == "approve"
    assert shown["flow_run_id"] == "run-1" and shown["token_id"] == signoff.token_ids["alice"]
    assert signoff.record(shown["code"]).status == WindowStatus.READY
