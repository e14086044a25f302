"""Pinned adapters as stored: one ``adapter_pins`` row per adapter, ``operator`` or ``hot``
(``rules/pinning.py``), every change audited in its own transaction.

The database decides every race. A person's pin is one upsert that inserts the row or turns a
hot one into the person's (never touching a person's pin already there); an unknown name is
the foreign key's refusal. Replacing the hot set runs under a transaction-level advisory lock
on Postgres (SQLite serialises its writers with ``BEGIN IMMEDIATE``): of two replacements at
once the second waits, then deletes and inserts against the first's committed rows, so the
set left is one of the two, never a mix; its inserts meet existing pins with ON CONFLICT DO
NOTHING, so no unique violation escapes and a person's pin stays a person's.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import delete, select, text
from sqlalchemy.exc import IntegrityError

from loragate.registry.db.database import Database, utc
from loragate.registry.db.schema import adapter_pins, adapters
from loragate.registry.errors import ErrorCode, NotFound
from loragate.registry.records.adapters import utcnow
from loragate.registry.rules.pinning import Pin, PinSource

# the advisory lock every replacement of the hot set takes (Postgres): any fixed 64-bit key
HOT_PINS_LOCK = 0x6C6F726167617465  # "loragate"
# the audit actions of a pin added or changed, and of one removed
PIN, UNPIN = "pin", "unpin"


def pin_from_row(row) -> Pin:
    m = row._mapping
    return Pin(m["adapter_name"], PinSource(m["source"]), m["pinned_by"], utc(m["pinned_at"]))


def unknown_adapter(name: str) -> NotFound:
    return NotFound(f"no adapter named {name!r} to pin", code=ErrorCode.UNKNOWN_ADAPTER, field="name")


class PinRepository:
    def __init__(self, db: Database):
        self.db = db

    def pins(self) -> list[Pin]:
        """Every pin, by name."""
        with self.db.reader.connect() as conn:
            return [pin_from_row(r) for r in conn.execute(select(adapter_pins).order_by(adapter_pins.c.adapter_name))]

    def pin(self, name: str, actor: str) -> tuple[Pin, bool]:
        """Pin ``name`` as a person's; returns (pin, changed). A hot pin becomes the person's;
        a person's pin already there is left as it is (changed False).

        Raises:
            NotFound: UNKNOWN_ADAPTER, no adapter of that name.
        """
        now = utcnow()
        insert = self.db.insert_statement()(adapter_pins).values(
            adapter_name=name, source=PinSource.OPERATOR.value, pinned_by=actor[:128], pinned_at=now
        )
        upsert = insert.on_conflict_do_update(
            index_elements=["adapter_name"],
            set_={"source": insert.excluded.source, "pinned_by": insert.excluded.pinned_by, "pinned_at": now},
            where=adapter_pins.c.source == PinSource.HOT.value,
        ).returning(*adapter_pins.c)
        try:
            with self.db.write() as conn:
                # what it was, for the audit log only: the row is held until the commit
                was = conn.execute(
                    select(adapter_pins.c.source).where(adapter_pins.c.adapter_name == name).with_for_update()
                ).scalar()
                row = conn.execute(upsert).first()
                if row is None:  # a person's pin already
                    kept = conn.execute(select(adapter_pins).where(adapter_pins.c.adapter_name == name)).one()
                    return pin_from_row(kept), False
                self.db.audit(conn, actor=actor, action=PIN, adapter_name=name, from_value=was, to_value=row.source)
        except IntegrityError as e:  # the foreign key: no such adapter
            raise unknown_adapter(name) from e
        return pin_from_row(row), True

    def unpin(self, name: str, actor: str) -> Pin:
        """Remove ``name``'s pin, a person's or a hot one; returns what it was.

        Raises:
            NotFound: UNKNOWN_ADAPTER for a name no adapter has; NOT_FOUND when it is not pinned.
        """
        with self.db.write() as conn:
            row = conn.execute(
                delete(adapter_pins).where(adapter_pins.c.adapter_name == name).returning(*adapter_pins.c)
            ).first()
            if row is None:
                if conn.execute(select(adapters.c.id).where(adapters.c.name == name)).first() is None:
                    raise unknown_adapter(name)
                raise NotFound(f"{name} is not pinned", field="name")
            self.db.audit(conn, actor=actor, action=UNPIN, adapter_name=name, from_value=row.source)
        return pin_from_row(row)

    def replace_hot(self, names: Sequence[str], actor: str) -> tuple[list[str], list[str]]:
        """Make the hot pins exactly ``names`` (less any a person pinned, which stay the
        person's), in one transaction; returns (added, removed), each audited.

        Raises:
            NotFound: UNKNOWN_ADAPTER when a name is no adapter's; nothing changed.
        """
        wanted = sorted(set(names))
        now = utcnow()
        try:
            with self.db.write() as conn:
                if not self.db.is_sqlite:
                    conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": HOT_PINS_LOCK})
                removed = sorted(
                    conn.execute(
                        delete(adapter_pins)
                        .where(adapter_pins.c.source == PinSource.HOT.value, adapter_pins.c.adapter_name.not_in(wanted))
                        .returning(adapter_pins.c.adapter_name)
                    ).scalars()
                )
                added: list[str] = []
                if wanted:
                    rows = [
                        {"adapter_name": n, "source": PinSource.HOT.value, "pinned_by": actor[:128], "pinned_at": now}
                        for n in wanted
                    ]
                    insert = self.db.insert_statement()(adapter_pins).values(rows)
                    added = sorted(
                        conn.execute(
                            insert.on_conflict_do_nothing(index_elements=["adapter_name"]).returning(
                                adapter_pins.c.adapter_name
                            )
                        ).scalars()
                    )
                for name in removed:
                    self.db.audit(conn, actor=actor, action=UNPIN, adapter_name=name, from_value=PinSource.HOT.value)
                for name in added:
                    self.db.audit(conn, actor=actor, action=PIN, adapter_name=name, to_value=PinSource.HOT.value)
        except IntegrityError as e:  # the foreign key: a name no adapter has
            known = self._known(wanted)
            raise unknown_adapter(next((n for n in wanted if n not in known), wanted[0])) from e
        return added, removed

    def _known(self, names: Sequence[str]) -> set[str]:
        with self.db.reader.connect() as conn:
            return set(conn.execute(select(adapters.c.name).where(adapters.c.name.in_(names))).scalars())
