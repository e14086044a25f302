"""The append-only audit log (Postgres triggers refuse UPDATE and DELETE on it), and the
references garbage collection must keep: every blob a version or a golden set names."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select

from registry.db.database import Database, utc
from registry.db.schema import adapter_versions, audit_events, golden_sets
from registry.records.adapters import AuditEvent


class AuditRepository:
    def __init__(self, db: Database):
        self.db = db

    def history(self, name: str) -> list[AuditEvent]:
        """The adapter's events, oldest first."""
        with self.db.reader.connect() as conn:
            rows = conn.execute(
                select(audit_events).where(audit_events.c.adapter_name == name).order_by(audit_events.c.id)
            )
            return [AuditEvent(**{**r._mapping, "at": utc(r.at)}) for r in rows]

    def count(self) -> int:
        with self.db.reader.connect() as conn:
            return conn.execute(select(func.count()).select_from(audit_events)).scalar_one()

    def referenced_digests(self) -> set[str]:
        """Every blob a version or a golden set refers to, as ``sha256:<hex>``."""
        with self.db.reader.connect() as conn:
            referenced = {
                f"sha256:{h}"
                for row in conn.execute(
                    select(
                        adapter_versions.c.weights_sha256,
                        adapter_versions.c.adapter_config_sha256,
                        adapter_versions.c.manifest_sha256,
                    )
                )
                for h in row
            }
            referenced.update(conn.execute(select(golden_sets.c.digest)).scalars())
        return referenced

    def record_gc(self, actor: str, details: dict[str, Any]) -> None:
        with self.db.write() as conn:
            self.db.audit(conn, actor=actor, action="gc", adapter_name=None, details=details)
