"""The append-only audit log (Postgres triggers refuse UPDATE and DELETE on it), the
references garbage collection must keep (every blob a version or a golden set names), and
traffic alerts kept as audit records.

A traffic alert (a tripped breaker, an adapter falling back too often) is recorded at most
once per adapter, kind, version and replica in ``ALERT_DEDUPE``; one that names its
``occurrence`` (a breaker trip's id on its replica) once, ever: every watch and evaluation
sees the same trip until it ages out of the replica's figures, and only a new record is
told to Slack. Whether one is new is decided under a lock, not by a read racing a write: SQLite's
writers are serialized (``BEGIN IMMEDIATE``), and on Postgres the check and the insert run
under a transaction-level advisory lock on the alert's key, so the second of two recorders
reads the first's committed row.
"""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select, text

from loragate.registry.db.database import Database, utc
from loragate.registry.db.schema import adapter_versions, audit_events, golden_sets
from loragate.registry.records.adapters import AuditEvent, utcnow

TRAFFIC_ALERT = "traffic_alert"
# the same alert is recorded (and told) once in this long: the fallback rate's own window
ALERT_DEDUPE = timedelta(minutes=15)


def _lock_key(*parts: str | None) -> int:
    """A signed 64-bit advisory-lock key for ``parts`` (Postgres's bigint)."""
    digest = hashlib.sha256("\x1f".join(p or "" for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


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

    def record_traffic_alert(
        self, actor: str, name: str, kind: str, version_id: str | None, replica: str | None, details: dict[str, Any]
    ) -> bool:
        """Record a traffic alert unless the same one (adapter, kind, version, replica) was
        recorded in the last ``ALERT_DEDUPE`` -- or, when ``details`` names its
        ``occurrence``, that occurrence ever; True when this call recorded it."""
        now = utcnow()
        occurrence = details.get("occurrence")
        same = [
            audit_events.c.adapter_name == name,
            audit_events.c.action == TRAFFIC_ALERT,
            audit_events.c.to_value == kind,
            audit_events.c.version_id.is_not_distinct_from(version_id),
            audit_events.c.details["replica"].as_string().is_not_distinct_from(replica),
        ]
        if occurrence is None:
            same.append(audit_events.c.at > now - ALERT_DEDUPE)
        else:
            same.append(audit_events.c.details["occurrence"].as_string() == str(occurrence))
        with self.db.write() as conn:
            if not self.db.is_sqlite:
                conn.execute(
                    text("SELECT pg_advisory_xact_lock(:k)"), {"k": _lock_key(name, kind, version_id, replica)}
                )
            recent = conn.execute(select(audit_events.c.id).where(*same).limit(1)).first()
            if recent is not None:
                return False
            self.db.audit(
                conn,
                actor=actor,
                action=TRAFFIC_ALERT,
                adapter_name=name,
                version_id=version_id,
                to_value=kind,
                at=now,
                details={**details, "kind": kind, "version_id": version_id, "replica": replica},
            )
        return True

    def traffic_alerts(self, since: datetime) -> list[dict[str, Any]]:
        """Traffic alerts recorded at or after ``since``, oldest first."""
        with self.db.reader.connect() as conn:
            rows = conn.execute(
                select(audit_events)
                .where(audit_events.c.action == TRAFFIC_ALERT, audit_events.c.at >= since)
                .order_by(audit_events.c.id)
            ).all()
        return [
            {
                **r.details,
                "at": utc(r.at).isoformat(),
                "name": r.adapter_name,
                "kind": r.to_value,
                "version_id": r.version_id,
                "actor": r.actor,
            }
            for r in rows
        ]
