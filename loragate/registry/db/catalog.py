"""Pinned base models: a base id and commit with the content digest and config facts they
were pinned with. Pinning the same base again is a no-op; the same id and commit with other
content is refused."""

from __future__ import annotations

from sqlalchemy import insert, select
from sqlalchemy.exc import IntegrityError

from loragate.registry.db.database import Database, utc
from loragate.registry.db.schema import base_models
from loragate.registry.errors import AlreadyExists, ConcurrentUpdate
from loragate.registry.records.adapters import utcnow
from loragate.registry.records.bases import BaseModelRecord


def base_from_row(row) -> BaseModelRecord:
    m = dict(row._mapping)
    m["created_at"] = utc(m["created_at"])
    return BaseModelRecord(**m)


class CatalogRepository:
    def __init__(self, db: Database):
        self.db = db

    def add(self, record: BaseModelRecord, actor: str) -> tuple[BaseModelRecord, bool]:
        """Pin a base; the same pin again is a no-op, returning (record, created).

        Raises:
            AlreadyExists: the id and commit are pinned with other content.
            ConcurrentUpdate: the pin could neither be inserted nor read back.
        """
        # a concurrent pin of the same base makes the insert fail once; the second pass reads it
        for _ in range(2):
            existing = self.get(record.base_model_id, record.base_model_commit)
            if existing is not None:
                same = (existing.content_digest, existing.config_sha256) == (
                    record.content_digest,
                    record.config_sha256,
                )
                if not same:
                    raise AlreadyExists(f"base {record.label} is already pinned with other content", field="id")
                return existing, False
            now = utcnow()
            values = {k: v for k, v in record.__dict__.items() if k not in ("created_at", "created_by")}
            try:
                with self.db.write() as conn:
                    conn.execute(insert(base_models).values(**values, created_at=now, created_by=actor))
                    self.db.audit(
                        conn,
                        actor=actor,
                        action="base_add",
                        adapter_name=None,
                        to_value=record.base_model_commit[:64],
                        details={"base_model_id": record.base_model_id, "source": record.source},
                    )
            except IntegrityError:
                continue
            return BaseModelRecord(**{**values, "created_at": now, "created_by": actor}), True
        raise ConcurrentUpdate(f"base {record.label} could not be pinned or read back")

    def get(self, base_model_id: str, commit: str) -> BaseModelRecord | None:
        with self.db.reader.connect() as conn:
            row = conn.execute(
                select(base_models).where(
                    base_models.c.base_model_id == base_model_id, base_models.c.base_model_commit == commit
                )
            ).first()
        return base_from_row(row) if row else None

    def bases(self, base_model_id: str | None = None) -> list[BaseModelRecord]:
        stmt = select(base_models).order_by(base_models.c.base_model_id, base_models.c.created_at)
        if base_model_id is not None:
            stmt = stmt.where(base_models.c.base_model_id == base_model_id)
        with self.db.reader.connect() as conn:
            return [base_from_row(r) for r in conn.execute(stmt)]
