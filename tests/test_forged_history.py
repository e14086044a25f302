"""Nobody forges a line of history: a holder or a reason with a newline, an ANSI escape or
a bidi override is refused at the door (exit 2, ``invalid_text``, nothing written), and
``loragate history`` escapes whatever the database holds, so a row written around the door
still prints as one line. On SQLite and Postgres.
"""

from __future__ import annotations

import json

import pytest
from sqlalchemy import insert

from loragate.registry.db.schema import audit_events
from loragate.registry.records.adapters import utcnow
from loragate.registry.rules.text import check_text, printable
from loragate.registry.service import Registry
from loragate.registry.settings import Settings
from tests.support.commands import main_with_tokens, role_tokens
from tests.support.registries import IN_PROCESS, SIGNING_KEY, registry_snapshot, sql_engine

NAME = "acme/tiny-llama/support"
# what an attacker appends to make `loragate history` show an approval nobody gave
FORGED_LINE = "\n2026-11-25 10:00:00  alice        promote production"
HOSTILE = {
    "newline": "deploy" + FORGED_LINE,
    "carriage return": "deploy\rapproved by alice",
    "ANSI escape": "\x1b[2K\x1b[1Gapproved by alice",
    "bidi override": "ok \u202eecila yb devorppa",
    "NUL": "a\x00b",
    "C1 control": "a\x9bb",
}


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def populated(request, tmp_path_factory, tiny_base, seeded_bundles):
    root = tmp_path_factory.mktemp(f"forged-{request.param}")
    url = f"sqlite:///{root / 'registry.db'}" if request.param == "sqlite" else request.getfixturevalue("pg_template")()
    cfg = Settings(home=root, database_url=url, artifacts=str(root / "artifacts"), actor="tests")
    with Registry.open(cfg, check_schema=False, principal=IN_PROCESS) as registry:
        registry.init()
        registry.add_base(str(tiny_base), "tiny-llama")
        registry.register_adapter(seeded_bundles[0], NAME)
        tokens = role_tokens(registry)
    env = {"LORAGATE_DATABASE_URL": url, "LORAGATE_ARTIFACTS": cfg.artifacts, "LORAGATE_ACTOR": "tests"}
    return cfg, env, tokens


def run_cli(monkeypatch, capsys, populated, *argv: str, as_json: bool = True) -> tuple[int, str]:
    _, env, tokens = populated
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    rc = main_with_tokens(tokens, [*argv, *(["--json"] if as_json else [])])
    out, _ = capsys.readouterr()
    return rc, out


@pytest.mark.parametrize("text", HOSTILE.values(), ids=HOSTILE.keys())
@pytest.mark.parametrize(
    "command",
    [
        ("token", "create", "--role", "activation", "--holder", "{text}"),
        ("key", "add", "{pem}", "--role", "signing", "--holder", "{text}"),
        ("promote", "{version}", "--to", "production", "--reason", "{text}"),
        ("rollback", NAME, "--reason", "{text}"),
    ],
    ids=["token holder", "key holder", "promote reason", "rollback reason"],
)
def test_control_characters_in_a_holder_or_reason_are_refused_and_change_nothing(
    populated, monkeypatch, capsys, tmp_path, command, text
):
    cfg, _, _ = populated
    pem = tmp_path / "key.pem"
    pem.write_bytes(SIGNING_KEY.public_pem)
    with Registry.open(cfg, principal=IN_PROCESS) as registry:
        version = registry.list_versions(NAME)[0].version_id
    argv = [a.format(text=text, pem=pem, version=version) for a in command]
    before = registry_snapshot(cfg)
    rc, out = run_cli(monkeypatch, capsys, populated, *argv)
    assert rc == 2, out
    error = json.loads(out)["error"]
    assert error["code"] == "invalid_text" and error["field"] in ("holder", "reason"), error
    assert registry_snapshot(cfg) == before


def test_history_prints_every_stored_event_on_one_line_whatever_it_holds(populated, monkeypatch, capsys):
    cfg, _, _ = populated
    with Registry.open(cfg, principal=IN_PROCESS) as registry:
        engine = sql_engine(registry)
    try:
        with engine.begin() as conn:  # around the door: straight into the table
            # (Postgres cannot store a NUL at all; the door refuses it on both)
            for what, text in HOSTILE.items():
                if "\x00" in text:
                    continue
                conn.execute(
                    insert(audit_events).values(
                        at=utcnow(),
                        actor="mallory\x1b[8m",
                        action="note",
                        adapter_name=NAME,
                        reason=f"{what}: {text}",
                        details={},
                    )
                )
    finally:
        engine.dispose()
    rc, out = run_cli(monkeypatch, capsys, populated, "history", NAME, as_json=False)
    assert rc == 0
    _, as_json = run_cli(monkeypatch, capsys, populated, "history", NAME)
    events = json.loads(as_json)
    lines = out.rstrip("\n").split("\n")
    assert len(lines) == len(events), "one printed line per event"
    assert not any(check_text_fails(line) for line in lines), "nothing a terminal obeys is printed"
    assert printable(FORGED_LINE) in out


def check_text_fails(line: str) -> bool:
    try:
        check_text(line, field="line", limit=10_000)
    except Exception:
        return True
    return False


def test_a_sign_off_form_carries_reviewer_and_comment_as_one_escaped_line_each():
    from loragate.flows.approval import Approval

    decision = Approval(approve=True, reviewer="alice", comment="fine" + FORGED_LINE + "\x1b[2K")
    assert decision.comment == printable("fine" + FORGED_LINE + "\x1b[2K")
    assert check_text(decision.comment, field="comment") == decision.comment
    assert Approval(approve=False, reviewer="bob\u202e").reviewer == "bob\\u202e"
