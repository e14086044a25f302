"""Which versions wait between gates, in three queries whatever the fleet's size (one per
gate; ``records/progress.py`` says what each wait means):

- validate: staging, validation pending, since it was registered;
- canary: staging, validation passed, never given a canary window, and the newest such
  version of its adapter (an older one was superseded), since its last validation ended;
- sign-off: a canary window ready, since its last observation (the one that made it ready).
"""

from __future__ import annotations

from sqlalchemy import exists, func, select

from loragate.registry.db.database import Database, utc
from loragate.registry.db.schema import adapter_versions, adapters, canary_observations, canary_windows, validation_runs
from loragate.registry.records.progress import Gate, Waiting
from loragate.registry.rules.canary import WindowStatus
from loragate.registry.rules.lifecycle import Stage, ValidationStatus

_v = adapter_versions
_newer = adapter_versions.alias("newer")  # Core's alias: the ORM's costs every command ~0.2 s to import
_STAGING = _v.c.stage == Stage.STAGING.value


class ProgressRepository:
    def __init__(self, db: Database):
        self.db = db

    def waiting(self) -> list[Waiting]:
        """Every version waiting for a gate, oldest wait first."""
        validate = (
            select(_v.c.version_id, adapters.c.name, adapters.c.base, _v.c.created_at.label("since"))
            .select_from(_v.join(adapters, adapters.c.id == _v.c.adapter_id))
            .where(_STAGING, _v.c.validation_status == ValidationStatus.PENDING.value)
        )
        validated_at = (
            select(func.max(validation_runs.c.finished_at))
            .where(validation_runs.c.version_id == _v.c.version_id)
            .scalar_subquery()
        )
        newer_candidate = exists().where(
            _newer.c.adapter_id == _v.c.adapter_id,
            _newer.c.stage == Stage.STAGING.value,
            _newer.c.validation_status == ValidationStatus.PASSED.value,
            _newer.c.created_at > _v.c.created_at,
        )
        canary = (
            select(_v.c.version_id, adapters.c.name, adapters.c.base, validated_at.label("since"))
            .select_from(_v.join(adapters, adapters.c.id == _v.c.adapter_id))
            .where(_STAGING, _v.c.validation_status == ValidationStatus.PASSED.value)
            # one column, not EXISTS (SELECT *): no role reads a window's bucket key (0015)
            .where(~select(canary_windows.c.id).where(canary_windows.c.version_id == _v.c.version_id).exists())
            .where(~newer_candidate)
        )
        ready_at = (
            select(func.max(canary_observations.c.at))
            .where(canary_observations.c.window_id == canary_windows.c.id)
            .scalar_subquery()
        )
        sign_off = (
            select(
                canary_windows.c.id,
                canary_windows.c.version_id,
                canary_windows.c.adapter_name,
                adapters.c.base,
                func.coalesce(ready_at, canary_windows.c.opened_at).label("since"),
                canary_windows.c.approval_flow_run_id,
            )
            .select_from(canary_windows.join(adapters, adapters.c.name == canary_windows.c.adapter_name))
            .where(canary_windows.c.status == WindowStatus.READY.value)
        )
        found: list[Waiting] = []
        with self.db.reader.connect() as conn:
            for r in conn.execute(validate):
                found.append(Waiting(Gate.VALIDATE, r.version_id, r.name, r.base, utc(r.since)))
            for r in conn.execute(canary):
                found.append(Waiting(Gate.CANARY, r.version_id, r.name, r.base, utc(r.since)))
            for r in conn.execute(sign_off):
                found.append(
                    Waiting(
                        Gate.SIGN_OFF,
                        r.version_id,
                        r.adapter_name,
                        r.base,
                        utc(r.since),
                        window_id=r.id,
                        approval_flow_run_id=r.approval_flow_run_id,
                    )
                )
        return sorted(found, key=lambda w: w.since)
