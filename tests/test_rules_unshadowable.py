"""The database's rules cannot be shadowed or walked around (migration 0010).

A role's database user writes raw SQL. Postgres searches a session's temporary schema first
for tables, so a rule that named ``pg_roles`` or ``approval_codes`` unqualified with the
caller's search path read whatever the caller had put in a temporary table of that name.
Every route around the production rule is a row here, tried as the role's user in one
transaction of its own: each is refused, and production stays as it was. The test
databases are clones of a migrated template (a clone does not inherit the template's
database privileges), so temporary tables can be made in them: what is tested is that the
rules read only their own tables. A database migrated in place refuses temporary tables
to the roles as well.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import DBAPIError

from kit.postgres import admin_engine, drop_database, pg_url
from loragate.registry.db import migrate
from tests import test_production_signoff_in_sql as signoff_in_sql
from tests.support.moves import promote
from tests.test_production_signoff_in_sql import NAME, POINT, World, refused

pytestmark = pytest.mark.postgres
# v1 on canary ready for its sign-off, v2 validated, an engine as the activation user
world = signoff_in_sql.world

ADAPTER = "(SELECT id FROM public.adapters WHERE name = :name)"


def _as(world: World, role: str) -> Engine:
    return create_engine(make_url(world.owner.settings.database_url).set(username=f"loragate_{role}"))


def _shadow_pg_roles(conn: Connection, w: World) -> None:
    conn.execute(text("CREATE TEMP TABLE pg_roles (rolname name, rolsuper boolean)"))
    conn.execute(text("INSERT INTO pg_roles VALUES (current_user, true)"))


def _shadow_approval_codes(conn: Connection, w: World) -> None:
    conn.execute(text("CREATE TEMP TABLE approval_codes (version_id text, decision text, applied_txid bigint)"))
    conn.execute(text("INSERT INTO approval_codes VALUES (:v, 'approve', txid_current())"), {"v": w.v1})


def _shadow_stage_pointers(conn: Connection, w: World) -> None:
    """``previous`` at v1 in a temporary stage_pointers: production 'returns' to it."""
    conn.execute(text("CREATE TEMP TABLE stage_pointers (adapter_id integer, stage text, version_id text)"))
    conn.execute(
        text(f"INSERT INTO stage_pointers VALUES ({ADAPTER}, 'previous', :v)"),
        {"v": w.v1, "name": NAME},
    )


def _shadow_adapter_versions(conn: Connection, w: World) -> None:
    conn.execute(text("CREATE TEMP TABLE adapter_versions (version_id text, adapter_id integer)"))
    conn.execute(text(f"INSERT INTO adapter_versions VALUES (:v, {ADAPTER})"), {"v": w.v1, "name": NAME})


# (object shadowed, how) -- then production is moved to v1, which nobody signed off
SHADOWS: list[tuple[str, Callable[[Connection, World], None]]] = [
    ("pg_roles", _shadow_pg_roles),
    ("approval_codes", _shadow_approval_codes),
    ("stage_pointers", _shadow_stage_pointers),
    ("adapter_versions", _shadow_adapter_versions),
]


@pytest.mark.parametrize("shadowed, shadow", SHADOWS, ids=[s[0] for s in SHADOWS])
def test_a_temporary_table_shadows_nothing_the_production_rule_reads(world, shadowed, shadow):
    def move(conn: Connection) -> None:
        shadow(conn, world)
        # the pointer itself named by its schema: the temporary stage_pointers is a decoy
        conn.execute(text(POINT.text.replace("INTO stage_pointers", "INTO public.stage_pointers")), params)

    params = {"stage": "production", "v": world.v1, "name": NAME}
    refused(world.activation, move)
    assert world.production() is None


def test_previous_cannot_be_pointed_elsewhere_through_a_temporary_stage_pointers(world):
    """``previous`` names only what production serves; a temporary stage_pointers saying
    production serves v1 would let the activation user aim ``previous`` at v1, and then
    "roll back" production onto a version nobody approved."""

    def aim_previous(conn: Connection) -> None:
        conn.execute(text("CREATE TEMP TABLE stage_pointers (adapter_id integer, stage text, version_id text)"))
        for stage in ("production", "previous"):
            conn.execute(
                text(f"INSERT INTO stage_pointers VALUES ({ADAPTER}, :stage, :v)"),
                {"stage": stage, "v": world.v1, "name": NAME},
            )
        point = POINT.text.replace("INTO stage_pointers", "INTO public.stage_pointers")
        conn.execute(text(point), {"stage": "previous", "v": world.v1, "name": NAME})
        conn.execute(text(point), {"stage": "production", "v": world.v1, "name": NAME})

    refused(world.activation, aim_previous)
    after = world.owner.get_adapter(NAME)
    assert (after.production, after.previous) == (None, None)


def test_a_temporary_validation_runs_does_not_pass_a_version(world):
    """The lifecycle rule reads the latest validation run: a temporary one saying 'failed'
    does not let the signing user fail a version whose real latest run passed."""
    signing = _as(world, "signing")
    try:
        with pytest.raises(DBAPIError, match="latest validation run"), signing.begin() as conn:
            conn.execute(text("CREATE TEMP TABLE validation_runs (id integer, version_id text, status text)"))
            conn.execute(text("INSERT INTO validation_runs VALUES (1000000, :v, 'failed')"), {"v": world.v2})
            conn.execute(
                text("UPDATE adapter_versions SET validation_status = 'failed' WHERE version_id = :v"), {"v": world.v2}
            )
    finally:
        signing.dispose()
    assert world.owner.get_version(world.v2).validation_status.value == "passed"


def _delete(stage: str) -> Callable[[Connection], None]:
    return lambda c: c.execute(
        text(f"DELETE FROM stage_pointers WHERE stage = :stage AND adapter_id = {ADAPTER}"),
        {"stage": stage, "name": NAME},
    )


@pytest.mark.parametrize("role", ["signing", "activation", "training", "admin", "fleet"])
@pytest.mark.parametrize("stage", ["production", "previous"])
def test_no_role_deletes_production_or_a_previous_production_still_needs(world, role, stage):
    promote(world.owner, world.v1, "production")
    promote(world.owner, world.v2, "canary")
    promote(world.owner, world.v2, "production")
    before = world.owner.get_adapter(NAME)
    assert (before.production, before.previous) == (world.v2, world.v1)
    engine = _as(world, role)
    try:
        with pytest.raises(DBAPIError) as failed, engine.begin() as conn:
            _delete(stage)(conn)
    finally:
        engine.dispose()
    assert getattr(failed.value.orig, "sqlstate", None) == "42501", failed.value
    assert world.owner.get_adapter(NAME) == before


def test_a_rollback_in_sql_still_drops_previous_once_production_is_back_on_it(world):
    promote(world.owner, world.v1, "production")
    promote(world.owner, world.v2, "canary")
    promote(world.owner, world.v2, "production")
    with world.activation.begin() as conn:
        conn.execute(POINT, {"stage": "production", "v": world.v1, "name": NAME})
        _delete("previous")(conn)
    after = world.owner.get_adapter(NAME)
    assert (after.production, after.previous) == (world.v1, None)


@pytest.fixture
def migrated_in_place():
    """A database migrated where it stands (not cloned): what a deployment runs."""
    admin = admin_engine()
    name = f"loragate_test_{uuid.uuid4().hex[:8]}_inplace"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    owner = create_engine(pg_url(name))
    migrate.upgrade(owner)
    yield pg_url(name)
    owner.dispose()
    drop_database(admin, name)
    admin.dispose()


@pytest.mark.parametrize("role", ["training", "signing", "activation", "admin", "fleet", "replica"])
def test_a_migrated_database_refuses_temporary_tables_to_every_role(migrated_in_place, role):
    engine = create_engine(make_url(migrated_in_place).set(username=f"loragate_{role}"))
    try:
        with pytest.raises(DBAPIError) as failed, engine.begin() as conn:
            conn.execute(text("CREATE TEMP TABLE pg_roles (rolname name, rolsuper boolean)"))
    finally:
        engine.dispose()
    assert getattr(failed.value.orig, "sqlstate", None) == "42501", failed.value


def test_every_loragate_function_pins_its_search_path(migrated_in_place):
    engine = create_engine(migrated_in_place)
    try:
        with engine.connect() as conn:
            functions = conn.execute(
                text("SELECT proname, proconfig FROM pg_proc WHERE proname LIKE 'loragate%' ORDER BY proname")
            ).all()
    finally:
        engine.dispose()
    assert len(functions) >= 8
    assert {name: config for name, config in functions if config != ["search_path=pg_catalog, pg_temp"]} == {}


@pytest.fixture
def not_the_owner(pg_template):
    """An empty database owned by the server's admin, and a user that owns its ``public``
    schema but not the database: what a deployment migrating with an application user
    gets. ``pg_template`` first: the loragate roles exist in the cluster."""
    admin = admin_engine()
    suffix = uuid.uuid4().hex[:8]
    name, migrator = f"loragate_test_{suffix}_notowner", f"loragate_test_migrator_{suffix}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE ROLE "{migrator}" LOGIN'))
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    in_database = create_engine(pg_url(name), isolation_level="AUTOCOMMIT")
    with in_database.connect() as conn:
        conn.execute(text(f'ALTER SCHEMA public OWNER TO "{migrator}"'))
    migrating = create_engine(make_url(pg_url(name)).set(username=migrator))
    yield name, migrator, migrating, in_database
    migrating.dispose()
    in_database.dispose()
    drop_database(admin, name)
    with admin.connect() as conn:
        conn.execute(text(f'DROP ROLE "{migrator}"'))
    admin.dispose()


def test_a_migrating_user_who_cannot_revoke_temporary_stops_saying_what_to_run_and_as_whom(not_the_owner):
    name, migrator, migrating, in_database = not_the_owner
    admin_user = make_url(pg_url(name)).username
    with pytest.raises(DBAPIError) as stopped:
        migrate.upgrade(migrating)
    assert getattr(stopped.value.orig, "sqlstate", None) == "42501", stopped.value
    first = str(stopped.value.orig).splitlines()[0]
    statement = f'REVOKE TEMPORARY ON DATABASE "{name}" FROM PUBLIC'
    assert first.startswith(f"run {statement} as the database owner ({admin_user}) or a superuser"), first
    assert migrator in first
    assert migrate.current_revision(migrating) is None  # one transaction: nothing kept
    # what it says, run as whom it says, lets the same user migrate to the end
    with in_database.connect() as conn:
        conn.execute(text(statement))
    with pytest.raises(DBAPIError) as stopped:  # the evaluator role, made by someone else (0015)
        migrate.upgrade(migrating)
    first = str(stopped.value.orig).splitlines()[0]
    grant = f"GRANT loragate_evaluator TO {migrator}"
    assert first.startswith(f"run {grant} as a superuser"), first
    assert migrate.current_revision(migrating) is None
    with in_database.connect() as conn:
        conn.execute(text(grant))
    migrate.upgrade(migrating)
    assert migrate.current_revision(migrating) == migrate.HEAD
