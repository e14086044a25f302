"""Registry helpers: a registry for tests that are not about the store, a validated and
signed version without running the gate, and looks under the registry (raw SQL, the
artifact store, audit rows, a snapshot of everything) to prove what an operation did or
did not change.
"""

from __future__ import annotations

from pathlib import Path

from kit.verdicts import record_verdict
from loragate.registry.rules.access import Principal
from loragate.registry.rules.canary import Verdict
from loragate.registry.service import Registry
from loragate.registry.settings import Settings
from loragate.registry.storage.signing import generate_key_pair

# tests call Registry directly with the database in hand: every role, like any library caller
IN_PROCESS = Principal.in_process("tester")


def mark_ready(registry: Registry, window_id: int) -> None:
    """An in-band observation that makes a canary window ready for its sign-off, without
    probing replicas."""
    record_verdict(registry, window_id, Verdict.READY, "ok")


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


SIGNING_KEY = generate_key_pair()


def sign(registry, version_id: str):
    """Sign a validated version with the tests' signing key (registered on first use), as
    the pipeline's validate gate does."""
    registry.add_signing_key(SIGNING_KEY.public_pem, "signing", "tests")
    return registry.sign_version(version_id, SIGNING_KEY.private_pem)[0]


def mark_validated(registry, version_id: str, passed: bool = True, signed: bool = True):
    """Record a validation outcome directly, and sign what passed: for lifecycle tests that
    are not about the gate."""
    from loragate.registry.records.adapters import utcnow
    from loragate.registry.records.reports import BaseUnderTest, CheckVerdict, ValidationReport

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
    from loragate.registry.db.store import make_engine

    return make_engine(registry.settings.database)


def artifact_store(registry):
    """The registry's artifact store, opened on its own: for tests that tamper with blobs."""
    from loragate.registry.storage.artifacts import open_artifact_store

    return open_artifact_store(registry.settings)


def audit_count(registry) -> int:
    from sqlalchemy import func, select

    from loragate.registry.db.schema import audit_events

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

    from loragate.registry.db.store import make_engine

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
