"""Alerts from live traffic as the registry keeps them: audit records (``traffic_alert``),
each recorded once per adapter, kind, version and replica in 15 minutes, a breaker trip once,
ever (``db/audit.py``), listed by ``loragate status``."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from loragate.registry.errors import ErrorCode, InvalidInput
from loragate.registry.rules.access import Action
from loragate.registry.rules.text import check_text
from loragate.registry.service.base import RegistryBase


class TrafficMixin(RegistryBase):
    def record_traffic_alert(self, name: str, kind: str, detail: dict[str, Any]) -> bool:
        """Record an alert of ``kind`` (``breaker_open``, ``fallback_rate``...) for adapter
        ``name``; ``detail`` may name the ``version_id`` (or ``version``) and the
        ``replica`` it is about, which with the name and kind make the alert's identity.
        True when recorded now: the same alert in the last 15 minutes is not recorded again
        (the caller tells Slack only about a True); one whose ``detail`` names its
        ``occurrence`` (a breaker trip's id) is recorded once for that occurrence, ever.

        Raises:
            InvalidInput: INVALID_TEXT, a kind or an occurrence that is not one short line
                of text.
        """
        check_text(kind, field="kind", limit=64)
        if detail.get("occurrence") is not None:
            check_text(str(detail["occurrence"]), field="occurrence", limit=128)
        if not kind:
            raise InvalidInput("kind must name the alert", code=ErrorCode.INVALID_TEXT, field="kind")
        actor = self._authorize_any((Action.WATCH_CANARY, Action.MANAGE_FLEET), name)
        version = detail.get("version_id", detail.get("version"))
        replica = detail.get("replica")
        return self._store.audit.record_traffic_alert(
            actor,
            name,
            kind,
            None if version is None else str(version)[:64],
            None if replica is None else str(replica),
            detail,
        )

    def traffic_alerts(self, since: datetime) -> list[dict[str, Any]]:
        """Traffic alerts recorded since ``since``, oldest first: each the alert's ``detail``
        plus ``at`` (ISO 8601), ``name``, ``kind``, ``version_id``, ``replica`` and ``actor``."""
        return self._store.audit.traffic_alerts(since)
