"""``Registry``: the only API the layers above ``registry/`` use, composed from one mixin
per concern over the SQL store, the artifact store and the settings."""

from __future__ import annotations

from loragate.registry.db.database import SessionLimits
from loragate.registry.db.store import SqlStore
from loragate.registry.rules.access import IssuedToken, Principal, Role, issue_token
from loragate.registry.rules.canary import CanaryThresholds
from loragate.registry.service.access import AccessMixin
from loragate.registry.service.approvals import ApprovalMixin
from loragate.registry.service.canary import CanaryMixin
from loragate.registry.service.fleet import FleetMixin
from loragate.registry.service.gc import GcMixin
from loragate.registry.service.intake import IntakeMixin
from loragate.registry.service.lifecycle import LifecycleMixin
from loragate.registry.service.pins import PinsMixin
from loragate.registry.service.reading import ReadingMixin
from loragate.registry.service.traffic import TrafficMixin
from loragate.registry.settings import Settings
from loragate.registry.storage.artifacts import open_artifact_store


class Registry(
    ReadingMixin,
    IntakeMixin,
    LifecycleMixin,
    AccessMixin,
    FleetMixin,
    PinsMixin,
    CanaryMixin,
    TrafficMixin,
    ApprovalMixin,
    GcMixin,
):
    @classmethod
    def open(cls, settings: Settings, *, check_schema: bool = True, principal: Principal | None = None) -> Registry:
        """Connect to the registry ``settings`` name, acting as ``principal`` (default: the
        holder of ``settings.token``).

        Raises:
            InvalidInput: NOT_INITIALIZED when ``check_schema`` and the schema is missing or
                outdated (``loragate init``); INVALID_SETTING for an unusable artifact location.
        """
        if settings.sqlite_path is not None:
            settings.sqlite_path.parent.mkdir(parents=True, exist_ok=True)
        registry = cls(
            SqlStore.from_url(
                settings.database,
                SessionLimits(
                    connect_timeout_s=settings.database_connect_timeout_s,
                    lock_timeout_s=settings.database_lock_timeout_s,
                    statement_timeout_s=settings.database_statement_timeout_s,
                    idle_in_transaction_timeout_s=settings.database_idle_in_transaction_timeout_s,
                ),
            ),
            open_artifact_store(settings),
            settings,
            principal,
        )
        if check_schema:
            registry._store.check_schema()
        return registry

    def close(self) -> None:
        self._store.close()

    def __enter__(self) -> Registry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def init(self) -> IssuedToken | None:
        """Create or upgrade the schema (Alembic) and the artifact store; returns the first
        admin token when the registry has no active one yet (shown once, stored hashed).

        Whoever can run migrations owns the database already, so this needs no token. It
        also copies the settings' limits into the database (``db/limits.py``): the owner's
        path is the only one that may write them.
        """
        self._store.upgrade_schema()
        actor = f"{self.settings.actor} (loragate init)"
        self._store.limits.set_canary_max_share(self.settings.canary_max_share, actor)
        self._store.limits.set_canary_thresholds(CanaryThresholds.from_settings(self.settings).as_dict(), actor)
        self._store.limits.set_hot_pins(self.settings.hot_pins, actor)
        self._artifacts.ensure()
        if any(t.role == Role.ADMIN and t.active for t in self._store.access.tokens()):
            return None
        issued = issue_token()
        self._store.access.create_token(issued, Role.ADMIN, None, "admin", actor)
        return issued
