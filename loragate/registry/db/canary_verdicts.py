"""A canary window's observations -- what each look of the evaluation saw and the verdict
it gave -- and the one move a verdict makes with its observation: ``ready`` (waits for a
sign-off) or ``undecided`` (over, closed). On Postgres both are written only through the
evaluator's function (migration 0015), so no role's user stores evidence a person reads
before signing, or moves a window to a verdict, by itself. The windows are ``db/canary.py``'s."""

from __future__ import annotations

import dataclasses
import json
from datetime import datetime
from typing import Any

from sqlalchemy import insert, select, text

from loragate.registry.db.canary import CanaryRepository
from loragate.registry.db.database import Database, utc
from loragate.registry.db.schema import canary_observations
from loragate.registry.errors import IllegalTransition
from loragate.registry.rules.canary import VERDICT_MOVES, Monitor, Observation, SideStats, Verdict, WindowStatus

# the evaluator's function (0015): the only writer of an observation on Postgres
RECORD_OBSERVATION = text(
    "SELECT observation_id, moved_to "
    "FROM public.loragate_record_observation(:window_id, CAST(:observation AS jsonb), :reason)"
)


def _observation_from_dict(data: dict[str, Any], observation_id: int) -> Observation:
    return Observation(
        id=observation_id,
        window_id=data["window_id"],
        at=utc(datetime.fromisoformat(data["at"])),
        canary=SideStats.from_dict(data["canary"]),
        production=SideStats.from_dict(data["production"]),
        drift=data["drift"],
        drifted_cases=list(data["drifted_cases"]),
        verdict=Verdict(data["verdict"]),
        monitors=[Monitor(**m) for m in data["monitors"]],
        reasons=list(data["reasons"]),
        live=data.get("live"),
        pairs_ms=tuple((float(c), float(p)) for c, p in data.get("pairs_ms") or ()),
        probe_evidence=data.get("probe_evidence"),
        latency_evidence=data.get("latency_evidence"),
    )


class CanaryVerdictRepository:
    def __init__(self, db: Database, windows: CanaryRepository):
        self.db = db
        self.windows = windows

    def record_observation(self, observation: Observation, actor: str) -> Observation:
        """Store an observation of an open window, with the move its verdict decides: READY
        (the window waits for a sign-off) or UNDECIDED (over, closed), audited; a ROLLBACK's
        move is the withdrawal's. On Postgres through the evaluator's function (migration
        0015), the only way in for every role's user.

        Raises:
            NotFound: no such window.
            IllegalTransition: the window is not open (only an open window is observed).
        """
        with self.db.write() as conn:
            row = self.windows.window_row(conn, observation.window_id, lock=True)
            if row.status != WindowStatus.OPEN.value:
                raise IllegalTransition(
                    f"canary window {row.id} of {row.version_id} is {row.status}: only an open window is observed",
                    field="window_id",
                )
            reason = "; ".join(observation.reasons)
            to = VERDICT_MOVES.get(observation.verdict)
            if self.db.is_sqlite:
                observation_id = conn.execute(
                    insert(canary_observations)
                    .values(
                        window_id=observation.window_id,
                        at=observation.at,
                        verdict=observation.verdict.value,
                        observation=observation.as_dict(),
                    )
                    .returning(canary_observations.c.id)
                ).scalar_one()
                if to is not None:
                    self.windows.set_status(conn, row, to, reason, observation.at)
            else:
                stored = conn.execute(
                    RECORD_OBSERVATION,
                    {"window_id": row.id, "observation": json.dumps(observation.as_dict()), "reason": reason},
                ).one()
                observation_id = stored.observation_id
            if to is not None:
                self.windows.audit_move(conn, row, WindowStatus.OPEN, to, reason, actor, observation.at)
        return dataclasses.replace(observation, id=observation_id)

    def observations(self, window_id: int) -> list[Observation]:
        with self.db.reader.connect() as conn:
            rows = conn.execute(
                select(canary_observations.c.id, canary_observations.c.observation)
                .where(canary_observations.c.window_id == window_id)
                .order_by(canary_observations.c.id)
            )
            return [_observation_from_dict(r.observation, r.id) for r in rows]
