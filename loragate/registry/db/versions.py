"""Adapter versions: immutable rows, one per registered bundle, chained by
``previous_version``. Registering takes the adapter's row lock (creating the adapter the
first time), so concurrent registers of one adapter form one linear chain; the same content
registered twice is the same version."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import bindparam, insert, select
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from loragate.registry.db.database import Database, utc
from loragate.registry.db.schema import adapter_versions, adapters
from loragate.registry.errors import ConcurrentUpdate, NotFound
from loragate.registry.records.adapters import AdapterVersion, utcnow
from loragate.registry.retrying import CONCURRENT_UPDATE_ATTEMPTS
from loragate.registry.rules.lifecycle import Stage, ValidationStatus
from loragate.registry.rules.names import AdapterName

# a version id names the second it was made: ``YYYYMMDD_HHMMSS_<weights hex12>``
VERSION_ID_FORMAT = "%Y%m%d_%H%M%S"
# how far past "now" a version id may be moved to avoid a collision
VERSION_ID_SPREAD = timedelta(hours=1)

VERSIONS_WITH_NAME = select(*adapter_versions.c, adapters.c.name).select_from(
    adapter_versions.join(adapters, adapters.c.id == adapter_versions.c.adapter_id)
)


def version_from_row(row, name: str | None = None) -> AdapterVersion:
    m = row._mapping
    return AdapterVersion(
        version_id=m["version_id"],
        name=name if name is not None else m["name"],
        content_address=m["content_address"],
        identity_sha256=m["identity_sha256"],
        manifest_sha256=m["manifest_sha256"],
        weights_sha256=m["weights_sha256"],
        weights_size=m["weights_size"],
        adapter_config_sha256=m["adapter_config_sha256"],
        base_model_id=m["base_model_id"],
        base_model_commit=m["base_model_commit"],
        lora_rank=m["lora_rank"],
        stage=Stage(m["stage"]),
        validation_status=ValidationStatus(m["validation_status"]),
        previous_version=m["previous_version"],
        manifest=m["manifest"],
        created_at=utc(m["created_at"]),
        created_by=m["created_by"],
    )


def _insert_adapter_if_missing_statement(db: Database):
    return (
        db.insert_statement()(adapters)
        .values(
            name=bindparam("name"),
            namespace=bindparam("namespace"),
            base=bindparam("base"),
            task=bindparam("task"),
            revision=0,
            created_at=bindparam("now"),
        )
        .on_conflict_do_nothing(index_elements=["name"])
    )


class VersionRepository:
    def __init__(self, db: Database):
        self.db = db
        self._insert_adapter_if_missing = _insert_adapter_if_missing_statement(db)

    def find_by_content(self, name: str, content_address: str) -> AdapterVersion | None:
        with self.db.reader.connect() as conn:
            row = conn.execute(
                VERSIONS_WITH_NAME.where(adapters.c.name == name, adapter_versions.c.content_address == content_address)
            ).first()
        return version_from_row(row) if row else None

    def get(self, version_id: str) -> AdapterVersion:
        """Raises:
        NotFound: no such version.
        """
        with self.db.reader.connect() as conn:
            row = conn.execute(VERSIONS_WITH_NAME.where(adapter_versions.c.version_id == version_id)).first()
        if row is None:
            raise NotFound(f"no adapter version {version_id!r}", field="version")
        return version_from_row(row)

    def versions(self, name: str | None = None) -> list[AdapterVersion]:
        stmt = VERSIONS_WITH_NAME.order_by(
            adapters.c.name, adapter_versions.c.created_at, adapter_versions.c.version_id
        )
        if name is not None:
            stmt = stmt.where(adapters.c.name == name)
        with self.db.reader.connect() as conn:
            return [version_from_row(r) for r in conn.execute(stmt)]

    def insert(
        self,
        name: AdapterName,
        content_address: str,
        weights_hex: str,
        finalize: Callable[[str | None, str, datetime], dict[str, Any]],
        *,
        actor: str,
    ) -> tuple[AdapterVersion, bool]:
        """Add a version of ``name`` after its newest one; returns (version, created).

        Under the adapter's row lock: the same content registered meanwhile is returned
        (created False); otherwise the previous version, the creation time (after the
        previous one's) and a free version id are chosen, and ``finalize(previous,
        version_id, created_at)`` gives the row's values (it stores the final manifest).

        Raises:
            ConcurrentUpdate: the row could not be inserted after retries (version ids
                colliding with other adapters' registers in the same second).
        """
        # a version id lost to another adapter's writer, like a lost compare-and-set
        for _ in range(CONCURRENT_UPDATE_ATTEMPTS):
            try:
                with self.db.write() as conn:
                    return self._insert(conn, name, content_address, weights_hex, finalize, actor)
            except IntegrityError:
                # a version id taken by another adapter's register in the same instant
                continue
        raise ConcurrentUpdate(f"could not register a version of {name}: its row kept colliding")

    def _insert(
        self,
        conn: Connection,
        name: AdapterName,
        content_address: str,
        weights_hex: str,
        finalize: Callable[[str | None, str, datetime], dict[str, Any]],
        actor: str,
    ) -> tuple[AdapterVersion, bool]:
        now = utcnow()
        adapter_id = self._lock_adapter_creating(conn, name, now)
        row = conn.execute(
            VERSIONS_WITH_NAME.where(
                adapter_versions.c.adapter_id == adapter_id, adapter_versions.c.content_address == content_address
            )
        ).first()
        if row is not None:
            return version_from_row(row), False
        latest = conn.execute(
            select(adapter_versions.c.version_id, adapter_versions.c.created_at)
            .where(adapter_versions.c.adapter_id == adapter_id)
            .order_by(adapter_versions.c.created_at.desc(), adapter_versions.c.version_id.desc())
            .limit(1)
        ).first()
        previous = latest.version_id if latest else None
        created_at = max(now, utc(latest.created_at) + timedelta(microseconds=1)) if latest else now
        version_id = self._free_version_id(conn, created_at, weights_hex)
        values = finalize(previous, version_id, created_at)
        row = conn.execute(
            insert(adapter_versions)
            .values(
                **values,
                version_id=version_id,
                adapter_id=adapter_id,
                previous_version=previous,
                created_at=created_at,
                created_by=actor,
            )
            .returning(*adapter_versions.c)
        ).first()
        self.db.audit(
            conn,
            actor=actor,
            action="register",
            adapter_name=str(name),
            version_id=version_id,
            to_value=Stage.STAGING.value,
            at=created_at,
            details={"content_address": content_address, "weights_sha256": weights_hex},
        )
        return version_from_row(row, name=str(name)), True

    def _lock_adapter_creating(self, conn: Connection, name: AdapterName, now: datetime) -> int:
        """The adapter's id, its row locked for this transaction; created when new.

        Concurrent first registrations of one name do not fail: the loser of the insert
        does nothing and waits on the winner's row lock.
        """
        conn.execute(
            self._insert_adapter_if_missing,
            {"name": str(name), "namespace": name.namespace, "base": name.base, "task": name.task, "now": now},
        )
        return conn.execute(select(adapters.c.id).where(adapters.c.name == str(name)).with_for_update()).scalar_one()

    def _free_version_id(self, conn: Connection, created_at: datetime, weights_hex: str) -> str:
        """The first free id from ``created_at`` on, found with one range query.

        Ids carry the second they were made; two different manifests over the same weights
        in one second take the next free second instead of colliding.
        """
        suffix = f"_{weights_hex[:12]}"
        first = f"{created_at:{VERSION_ID_FORMAT}}{suffix}"
        last = f"{created_at + VERSION_ID_SPREAD:{VERSION_ID_FORMAT}}{suffix}"
        taken = set(
            conn.execute(
                select(adapter_versions.c.version_id).where(
                    adapter_versions.c.version_id.between(first, last),
                    adapter_versions.c.version_id.endswith(suffix, autoescape=True),
                )
            ).scalars()
        )
        for offset in range(int(VERSION_ID_SPREAD.total_seconds()) + 1):
            candidate = f"{created_at + timedelta(seconds=offset):{VERSION_ID_FORMAT}}{suffix}"
            if candidate not in taken:
                return candidate
        raise ConcurrentUpdate(f"no free version id within {VERSION_ID_SPREAD} of {first}")
