"""What every concern of ``Registry`` shares: the SQL store, the artifact store, the
settings, and who is calling. Reads are open to whoever reaches the database; every write
is authorized first, for the ``principal`` given, or else for the token in
``settings.token`` (looked up on the first write, so read-only commands never need one)."""

from __future__ import annotations

from loragate.registry.db.store import SqlStore
from loragate.registry.errors import PermissionDenied
from loragate.registry.rules.access import Action, Principal, hash_secret, secret_matches, split_token
from loragate.registry.settings import Settings
from loragate.registry.storage.artifacts import ArtifactStore


class RegistryBase:
    def __init__(
        self, store: SqlStore, artifacts: ArtifactStore, settings: Settings, principal: Principal | None = None
    ):
        self._store = store
        self._artifacts = artifacts
        self.settings = settings
        self._principal = principal

    @property
    def artifacts_location(self) -> str:
        return self._artifacts.location

    @property
    def principal(self) -> Principal:
        """Raises:
        PermissionDenied: no token, or one that is malformed, unknown or revoked.
        """
        if self._principal is None:
            self._principal = self.authenticate(self.settings.token)
        return self._principal

    def authenticate(self, token: str | None) -> Principal:
        """Raises:
        PermissionDenied: no token, or one that is malformed, unknown or revoked (the
            message never repeats the token).
        """
        if not token:
            raise PermissionDenied("this needs a token: set LORAGATE_TOKEN or pass --token", field="LORAGATE_TOKEN")
        token_id, secret = split_token(token)
        found = self._store.access.token(token_id)
        if found is None or not secret_matches(hash_secret(secret), found[1]):
            raise PermissionDenied(f"token {token_id} is not known to this registry", field="LORAGATE_TOKEN")
        record = found[0]
        if not record.active:
            raise PermissionDenied(f"token {token_id} was revoked", field="LORAGATE_TOKEN")
        return Principal.of_token(record, secret)

    def _authorize(self, action: Action, name: str | None = None) -> str:
        """The actor to record, once the principal may do ``action`` on ``name``.

        Raises:
            PermissionDenied: nothing was changed.
        """
        principal = self.principal
        principal.require(action, name)
        return principal.actor

    def _authorize_any(self, actions: tuple[Action, ...], name: str | None = None) -> str:
        """Raises:
        PermissionDenied: none of ``actions`` is allowed.
        """
        principal = self.principal
        if not any(principal.may(action, name) for action in actions):
            principal.require(actions[0], name)  # raises, naming the first
        return principal.actor
