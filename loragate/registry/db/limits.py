"""The registry's own limits, kept in the database for the database's rules to read: one row
(``registry_limits``, migration 0012) that only the owner writes and every role's user reads.

The operator sets a limit in the settings; ``loragate init`` -- the owner's path, the one the
Kubernetes migrations Job runs -- copies it here, so the rules Postgres enforces on the
roles' users need nothing from any process's environment. Three limits: the largest share
of an adapter's live requests a canary may answer without a person's sign-off (the
application checks its setting, the database this row: a process whose setting differs is
held to the lower of the two), the thresholds a canary window is judged by (0015): a
window a role's user opens takes these, whatever the opener's settings said, and the most
pins of a base a hot pin may join (0016, held to the lower of it and the setting too).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import insert, select, update

from loragate.registry.db.database import Database
from loragate.registry.db.schema import registry_limits

ROW = 1


class LimitsRepository:
    def __init__(self, db: Database):
        self.db = db

    def canary_max_share(self) -> float:
        """The cap the database holds the roles' users to (0 without the row: the rules
        read a missing row as 0, refusing every share but none)."""
        with self.db.reader.connect() as conn:
            found = conn.execute(select(registry_limits.c.canary_max_share)).scalar()
        return float(found) if found is not None else 0.0

    def set_canary_max_share(self, value: float, actor: str) -> bool:
        """Write the cap from the operator's setting, audited with what it replaced; the
        same value again writes nothing. True when it changed. The owner's alone: no role's
        user may write the row (a Postgres refusal is PermissionDenied)."""
        return self._set("canary_max_share", value, actor, shown=repr(value))

    def set_canary_thresholds(self, thresholds: dict[str, Any], actor: str) -> bool:
        """Write the thresholds every window a role's user opens is held to, from the
        operator's settings, audited with what they replaced; the same again writes nothing.
        The row must exist (migration 0012 writes it; ``set_canary_max_share`` before this)."""
        return self._set("canary_thresholds", thresholds, actor, shown="canary_thresholds")

    def hot_pins(self) -> int | None:
        """The hot-pin limit the database holds every role's user to; None before init wrote it."""
        with self.db.reader.connect() as conn:
            found = conn.execute(select(registry_limits.c.hot_pins).where(registry_limits.c.id == ROW)).scalar()
        return None if found is None else int(found)

    def set_hot_pins(self, value: int, actor: str) -> bool:
        """Write the hot-pin limit from ``LORAGATE_HOT_PINS``, audited with what it replaced;
        the same again writes nothing. The row must exist (``set_canary_max_share`` first)."""
        return self._set("hot_pins", value, actor, shown=repr(value))

    def _set(self, limit: str, value: Any, actor: str, *, shown: str) -> bool:
        """One limit of the row written (the row itself, for the first), audited as
        ``registry_limit`` with what it replaced; the same value again writes nothing."""
        column = registry_limits.c[limit]
        with self.db.write() as conn:
            found = conn.execute(select(registry_limits.c.id, column).where(registry_limits.c.id == ROW)).first()
            before = None if found is None else found[1]
            if found is not None and before == value:
                return False
            if found is None:
                conn.execute(insert(registry_limits).values(id=ROW, **{limit: value}))
            else:
                conn.execute(update(registry_limits).where(registry_limits.c.id == ROW).values(**{limit: value}))
            self.db.audit(
                conn,
                actor=actor,
                action="registry_limit",
                adapter_name=None,
                from_value=None if before is None or limit == "canary_thresholds" else repr(before),
                to_value=shown,
                details={"limit": limit, "from": before, "to": value},
            )
        return True
