"""The replicas of the serving fleet: each a vLLM server of one pinned base in one role,
with the directory it loads adapters from and its LoRA limits. Adding the same replica
again is a no-op; the same URL with another configuration is refused. What the switch and
reconcile do to replicas is audited here too."""

from __future__ import annotations

import dataclasses
from typing import Any

from sqlalchemy import delete, insert, select
from sqlalchemy.exc import IntegrityError

from loragate.registry.db.database import Database, utc
from loragate.registry.db.pointers import audit_fleet_actions
from loragate.registry.db.schema import replicas
from loragate.registry.errors import AlreadyExists, NotFound
from loragate.registry.records.adapters import utcnow
from loragate.registry.rules.fleet import Replica, ReplicaRole


def replica_from_row(row) -> Replica:
    m = row._mapping
    return Replica(
        url=m["url"],
        base_model_id=m["base_model_id"],
        base_model_commit=m["base_model_commit"],
        role=ReplicaRole(m["role"]),
        adapter_dir=m["adapter_dir"],
        max_lora_rank=m["max_lora_rank"],
        max_loras=m["max_loras"],
        served_model_name=m["served_model_name"],
        created_at=utc(m["created_at"]),
        created_by=m["created_by"],
    )


class FleetRepository:
    def __init__(self, db: Database):
        self.db = db

    def add(self, replica: Replica, actor: str) -> tuple[Replica, bool]:
        """Add a replica to the fleet; the same replica again is a no-op, returning (replica, created).

        Raises:
            AlreadyExists: the URL is in the fleet with another configuration.
        """
        existing = self.get(replica.url)
        if existing is not None:
            if dataclasses.replace(existing, created_at=None, created_by=None) != replica:
                raise AlreadyExists(f"replica {replica.url} is in the fleet with another configuration", field="url")
            return existing, False
        now = utcnow()
        values = {**replica.as_dict(), "created_at": now, "created_by": actor}
        try:
            with self.db.write() as conn:
                conn.execute(insert(replicas).values(**values))
                self.db.audit(
                    conn,
                    actor=actor,
                    action="fleet_add",
                    adapter_name=None,
                    to_value=replica.url[:64],
                    details=replica.as_dict(),
                )
        except IntegrityError as e:
            raise AlreadyExists(f"replica {replica.url} was added meanwhile", field="url") from e
        return dataclasses.replace(replica, created_at=now, created_by=actor), True

    def remove(self, url: str, actor: str) -> Replica:
        """Raises:
        NotFound: no replica with that URL.
        """
        with self.db.write() as conn:
            row = conn.execute(select(replicas).where(replicas.c.url == url)).first()
            if row is None:
                raise NotFound(f"no replica {url} in the fleet", field="url")
            conn.execute(delete(replicas).where(replicas.c.url == url))
            self.db.audit(conn, actor=actor, action="fleet_remove", adapter_name=None, from_value=url[:64])
        return replica_from_row(row)

    def get(self, url: str) -> Replica | None:
        with self.db.reader.connect() as conn:
            row = conn.execute(select(replicas).where(replicas.c.url == url)).first()
        return replica_from_row(row) if row else None

    def replicas(self, base_model_id: str | None = None) -> list[Replica]:
        stmt = select(replicas).order_by(replicas.c.base_model_id, replicas.c.role, replicas.c.url)
        if base_model_id is not None:
            stmt = stmt.where(replicas.c.base_model_id == base_model_id)
        with self.db.reader.connect() as conn:
            return [replica_from_row(r) for r in conn.execute(stmt)]

    def record_actions(self, actor: str, action: str, entries: list[dict[str, Any]], reason: str | None) -> None:
        """One audit event per fleet action, in a transaction of their own (a reconcile's)."""
        if not entries:
            return
        with self.db.write() as conn:
            audit_fleet_actions(self.db, conn, actor, action, entries, reason)
