"""History cannot be rewritten with SQL, on SQLite and on Postgres.

Each case runs one statement an attacker or a careless operator could type into a database
shell against a real populated registry, and checks that the database refuses it and that
every row is as it was.
"""

from __future__ import annotations

import pytest
from sqlalchemy import MetaData, select, text

from kit.tenant_tasks import write_golden_set
from tests.support.moves import promote
from tests.support.registries import mark_validated

NAME = "acme/tiny-llama/support"


@pytest.fixture
def history(cataloged, seeded_bundles, tmp_path, sql):
    """v1 validated and in production, v2 pending in staging, a golden set attached."""
    registry, _ = cataloged
    v1 = registry.register_adapter(seeded_bundles[0], NAME).version.version_id
    v2 = registry.register_adapter(seeded_bundles[1], NAME).version.version_id
    registry.attach_golden_set(NAME, write_golden_set("support", tmp_path / "g.jsonl"))
    mark_validated(registry, v1)
    promote(registry, v1, "canary")
    promote(registry, v1, "production")
    return registry, v1, v2, sql


def rows(engine) -> dict[str, list[str]]:
    meta = MetaData()
    with engine.connect() as conn:
        meta.reflect(conn)
        return {t.name: sorted(repr(tuple(r)) for r in conn.execute(select(t))) for t in meta.sorted_tables}


# (case, statement; {v1}/{v2} are the version ids, both dialects unless marked)
REWRITES = [
    ("delete-a-version", "DELETE FROM adapter_versions WHERE version_id = '{v2}'"),
    ("delete-every-version", "DELETE FROM adapter_versions"),
    ("rename-a-version", "UPDATE adapter_versions SET version_id = 'forged' WHERE version_id = '{v2}'"),
    ("cut-the-lineage", "UPDATE adapter_versions SET previous_version = NULL WHERE version_id = '{v2}'"),
    ("graft-the-lineage", "UPDATE adapter_versions SET previous_version = '{v2}' WHERE version_id = '{v1}'"),
    ("pass-without-a-run", "UPDATE adapter_versions SET validation_status = 'passed' WHERE version_id = '{v2}'"),
    ("back-to-pending", "UPDATE adapter_versions SET validation_status = 'pending' WHERE version_id = '{v1}'"),
    ("staging-straight-to-production", "UPDATE adapter_versions SET stage = 'production' WHERE version_id = '{v2}'"),
    ("production-back-to-staging", "UPDATE adapter_versions SET stage = 'staging' WHERE version_id = '{v1}'"),
    ("forge-a-run-result", "UPDATE validation_runs SET status = 'failed'"),
    ("erase-the-runs", "DELETE FROM validation_runs"),
    ("repin-a-base", "UPDATE base_models SET config_sha256 = '" + "0" * 64 + "'"),
    ("unpin-a-base", "DELETE FROM base_models"),
    ("swap-a-golden-set", "UPDATE golden_sets SET digest = 'sha256:" + "0" * 64 + "'"),
    ("drop-a-golden-set", "DELETE FROM golden_sets"),
    ("rename-an-adapter", "UPDATE adapters SET name = 'mallory/tiny-llama/support'"),
    ("delete-an-adapter", "DELETE FROM adapters"),
    (
        "fork-the-lineage",
        "INSERT INTO adapter_versions (version_id, adapter_id, content_address, identity_sha256, manifest_sha256, "
        "weights_sha256, weights_size, adapter_config_sha256, base_model_id, base_model_commit, lora_rank, stage, "
        "validation_status, previous_version, manifest, created_at, created_by) "
        "SELECT 'fork', adapter_id, 'sha256:fork', identity_sha256, manifest_sha256, weights_sha256, weights_size, "
        "adapter_config_sha256, base_model_id, base_model_commit, lora_rank, 'staging', 'pending', previous_version, "
        "manifest, created_at, created_by FROM adapter_versions WHERE version_id = '{v2}'",
    ),
]
# SQLite has no TRUNCATE (its DELETE cases above cover the same ground)
POSTGRES_ONLY = [
    ("truncate-versions", "TRUNCATE adapter_versions CASCADE"),
    ("truncate-runs", "TRUNCATE validation_runs CASCADE"),
    ("truncate-signatures", "TRUNCATE version_signatures"),
    ("truncate-bases", "TRUNCATE base_models CASCADE"),
    ("truncate-golden-sets", "TRUNCATE golden_sets"),
]
REFUSED = "immutable|append-only|never deleted|write-once|cannot go|must be|UNIQUE|unique|may only"


def refused_and_unchanged(sql, statement: str) -> None:
    before = rows(sql)
    with pytest.raises(Exception, match=REFUSED), sql.begin() as conn:
        conn.execute(text(statement))
    assert rows(sql) == before


@pytest.mark.parametrize("case, statement", REWRITES, ids=[c[0] for c in REWRITES])
def test_history_cannot_be_rewritten_in_sql(history, case, statement):
    _, v1, v2, sql = history
    refused_and_unchanged(sql, statement.format(v1=v1, v2=v2))


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
@pytest.mark.parametrize("case, statement", POSTGRES_ONLY, ids=[c[0] for c in POSTGRES_ONLY])
def test_truncate_is_refused_on_postgres(history, case, statement):
    refused_and_unchanged(history[3], statement)


def test_the_registry_itself_still_moves_everything_the_triggers_guard(history):
    """The guards refuse rewrites, not the lifecycle: validate, promote and roll back still work."""
    registry, v1, v2, _ = history
    mark_validated(registry, v2, passed=False)  # pending -> failed, staging -> rejected
    assert (registry.get_version(v2).stage, registry.get_version(v2).validation_status) == ("rejected", "failed")
    mark_validated(registry, v1, passed=False)  # a production version's re-validation fails
    mark_validated(registry, v1, passed=True)  # and passes again: the latest run decides
    assert registry.get_version(v1).validation_status == "passed"
