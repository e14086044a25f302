"""Production moves only on a person's sign-off, decided by Postgres too (migration 0009).

Whoever holds the ``activation`` database user's credentials -- a process on the release
pool's worker, say, with the pipeline's token beside them -- writes SQL directly. The
database lets that user point production at a version only when a redeemed approve code
for it was applied in the same transaction, or back at ``previous``; ``previous`` only at
what production serves; and codes are issued, used and applied only through functions that
check a person's token secret and the code's secret. Each probe runs in a transaction of
its own as the activation user; an allowed one commits.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import DBAPIError

from loragate.registry.rules.access import split_token
from loragate.registry.rules.approvals import PresentedCode, issue_code
from loragate.registry.service import Registry
from loragate.registry.settings import Settings
from tests.support.moves import promote
from tests.support.registries import IN_PROCESS, mark_ready, mark_validated

pytestmark = pytest.mark.postgres

NAME = "acme/tiny-llama/support"
ISSUE = text(
    "SELECT loragate_issue_approval_code(:code_id, :secret_sha256, :window_id, :v, :name, 'approve', 300, "
    ":token_id, :token_secret)"
)
USE = text("SELECT loragate_use_approval_code(:code_id, :secret, 'probe')")
APPLY = text("SELECT loragate_apply_approval(:v, NULL)")
POINT = text(
    "INSERT INTO stage_pointers (adapter_id, stage, version_id, moved_at) "
    "SELECT id, :stage, :v, now() FROM adapters WHERE name = :name "
    "ON CONFLICT (adapter_id, stage) DO UPDATE SET version_id = excluded.version_id, moved_at = excluded.moved_at"
)


@dataclass
class World:
    """v1 on canary with a window ready for its sign-off, v2 validated; a person's and the
    pipeline's activation tokens; an engine as the activation database user."""

    owner: Registry
    activation: Engine
    v1: str
    v2: str
    window_id: int
    person: str = field(repr=False)
    pipeline: str = field(repr=False)

    def issue(self, conn: Connection, token: str, version: str | None = None) -> str:
        """A code issued through the function with ``token``'s id and secret; the code."""
        issued = issue_code()
        token_id, secret = split_token(token)
        conn.execute(
            ISSUE,
            {
                "code_id": issued.code_id,
                "secret_sha256": issued.secret_hash,
                "window_id": self.window_id,
                "v": version or self.v1,
                "name": NAME,
                "token_id": token_id,
                "token_secret": secret,
            },
        )
        return issued.code

    def production(self) -> str | None:
        return self.owner.get_adapter(NAME).production


def refused(engine: Engine, probe: Callable[[Connection], object]) -> str:
    """``probe`` in a transaction of its own must fail with insufficient privilege (42501)."""
    with pytest.raises(DBAPIError) as failed, engine.begin() as conn:
        probe(conn)
    assert getattr(failed.value.orig, "sqlstate", None) == "42501", failed.value
    return str(failed.value.orig)


def use(conn: Connection, code: str) -> datetime | None:
    presented = PresentedCode.parse(code)
    return conn.execute(USE, {"code_id": presented.code_id, "secret": presented.secret}).scalar()


@pytest.fixture
def world(pg_template, seeded_bundles, tiny_base, tmp_path: Path):
    url = pg_template()
    settings = Settings(home=tmp_path / "home", database_url=url, artifacts=str(tmp_path / "artifacts"))
    owner = Registry.open(settings, principal=IN_PROCESS)
    owner.add_base(str(tiny_base), "tiny-llama")
    v1, v2 = (owner.register_adapter(b, NAME).version.version_id for b in seeded_bundles[:2])
    for v in (v1, v2):
        mark_validated(owner, v)
    promote(owner, v1, "canary")
    window, _ = owner.open_canary_window(v1)
    mark_ready(owner, window.id)
    person = owner.create_token("activation", "alice")[1]
    pipeline = owner.create_token("activation", "pipeline-activation", pipeline=True)[1]
    activation = create_engine(make_url(url).set(username="loragate_activation"))
    yield World(owner, activation, v1, v2, window.id, person, pipeline)
    activation.dispose()
    owner.close()


def test_production_moves_in_sql_only_on_a_persons_sign_off_applied_in_its_transaction(world):
    def move(conn: Connection) -> None:
        conn.execute(POINT, {"stage": "production", "v": world.v1, "name": NAME})

    assert "sign-off" in refused(world.activation, move)  # no sign-off at all

    # a code the user writes itself, or has the function issue to the pipeline's token or to
    # a forged secret: refused
    refused(
        world.activation,
        lambda c: c.execute(
            text(
                "INSERT INTO approval_codes (code_id, secret_sha256, version_id, adapter_name, token_id, reviewer, "
                "decision, issued_at, expires_at, used_at) SELECT 'c0ffee000009', 'x', :v, :name, token_id, holder, "
                "'approve', now(), now() + interval '5 minutes', now() FROM api_tokens LIMIT 1"
            ),
            {"v": world.v1, "name": NAME},
        ),
    )
    assert "person" in refused(world.activation, lambda c: world.issue(c, world.pipeline))
    forged = world.person[:-4] + "AAAA"
    assert "person" in refused(world.activation, lambda c: world.issue(c, forged))

    # a person's code, issued but never used: applying it finds nothing, the move is refused
    with world.activation.begin() as conn:
        code = world.issue(conn, world.person)
    refused(world.activation, lambda c: (c.execute(APPLY, {"v": world.v1}), move(c)))
    # used with a wrong secret: not used
    with world.activation.begin() as conn:
        assert use(conn, code[:-4] + "AAAA") is None
    # used with its secret, applied and moved in another transaction than the move: refused
    with world.activation.begin() as conn:
        assert use(conn, code) is not None
        assert conn.execute(APPLY, {"v": world.v1}).scalar() == PresentedCode.parse(code).code_id
    refused(world.activation, move)
    assert world.production() is None

    # a second person's code, used, applied in the move's own transaction: production moves
    with world.activation.begin() as conn:
        second = world.issue(conn, world.person)
        use(conn, second)
    with world.activation.begin() as conn:
        assert conn.execute(APPLY, {"v": world.v1}).scalar() == PresentedCode.parse(second).code_id
        move(conn)
    assert world.production() == world.v1
    with world.activation.begin() as conn:  # consumed: applying again finds nothing
        assert conn.execute(APPLY, {"v": world.v1}).scalar() is None


def test_in_sql_production_returns_to_previous_and_previous_names_only_what_production_served(world):
    promote(world.owner, world.v1, "production")  # the owner: not limited
    promote(world.owner, world.v2, "canary")
    promote(world.owner, world.v2, "production")
    assert world.owner.get_adapter(NAME).previous == world.v1

    def point(stage: str, version: str) -> Callable[[Connection], None]:
        return lambda c: c.execute(POINT, {"stage": stage, "v": version, "name": NAME})

    with world.activation.begin() as conn:  # a rollback: back to previous, no code needed
        point("production", world.v1)(conn)
        conn.execute(
            text("DELETE FROM stage_pointers WHERE stage = 'previous' AND adapter_id = (SELECT id FROM adapters)")
        )
    assert world.production() == world.v1
    # v2 was production once, but is neither previous now nor signed off again
    refused(world.activation, point("production", world.v2))
    # previous at a version production does not serve now: refused
    refused(world.activation, point("previous", world.v2))
    with world.activation.begin() as conn:  # previous at what production serves: allowed
        point("previous", world.v1)(conn)
