"""Who may act: API tokens (issued to a holder for a role, optionally bound to a namespace,
shown once, stored hashed) and the public halves of signing keys. Both are admin work."""

from __future__ import annotations

from loragate.registry.errors import ErrorCode, InvalidInput
from loragate.registry.records.adapters import utcnow
from loragate.registry.rules.access import (
    SIGNING_KEY_ROLES,
    Action,
    SigningKey,
    TokenKind,
    TokenRecord,
    check_namespace,
    issue_token,
    parse_role,
)
from loragate.registry.rules.text import check_text
from loragate.registry.service.base import RegistryBase
from loragate.registry.storage.signing import key_id

# the audit log records "<holder> (<role> token <id>)" in 128 characters
MAX_HOLDER = 64


def _holder(value: str, what: str) -> str:
    # control characters are invalid_text; the length is the holder rule's own, below
    holder = (check_text(value, field="holder", limit=None) or "").strip()
    if not holder or len(holder) > MAX_HOLDER:
        raise InvalidInput(
            f"holder must name who holds {what} (1-{MAX_HOLDER} characters)",
            code=ErrorCode.INVALID_HOLDER,
            field="holder",
        )
    return holder


class AccessMixin(RegistryBase):
    def create_token(
        self, role: str, holder: str, namespace: str | None = None, *, pipeline: bool = False
    ) -> tuple[TokenRecord, str]:
        """A new token for ``holder``, bound to ``role`` and, optionally, a namespace pattern;
        returns its record and the token, shown once. A ``pipeline`` token (a work pool's) is
        never issued an approval code: it moves production only on a person's sign-off.

        Raises:
            PermissionDenied: not an admin.
            InvalidInput: INVALID_ROLE, INVALID_NAMESPACE or INVALID_HOLDER.
        """
        actor = self._authorize(Action.MANAGE_TOKENS)
        parsed = parse_role(role)
        pattern = check_namespace(namespace)
        holder = _holder(holder, "the token")
        issued = issue_token()
        kind = TokenKind.PIPELINE if pipeline else TokenKind.PERSON
        return self._store.access.create_token(issued, parsed, pattern, holder, actor, kind), issued.token

    def revoke_token(self, token_id: str) -> TokenRecord:
        """Raises:
        PermissionDenied: not an admin.
        NotFound: no such token.
        """
        return self._store.access.revoke_token(token_id, self._authorize(Action.MANAGE_TOKENS))

    def list_tokens(self) -> list[TokenRecord]:
        """Raises:
        PermissionDenied: not an admin.
        """
        self._authorize(Action.MANAGE_TOKENS)
        return self._store.access.tokens()

    def add_signing_key(self, public_pem: bytes, role: str, holder: str) -> tuple[SigningKey, bool]:
        """Register a public key for ``role`` (a production signature must be by a
        ``signing`` key); the same key again is a no-op.

        Raises:
            PermissionDenied: not an admin.
            InvalidInput: not an EC public key; INVALID_ROLE; INVALID_HOLDER.
            AlreadyExists: the key is registered for another role or holder.
        """
        actor = self._authorize(Action.MANAGE_KEYS)
        parsed = parse_role(role, allowed=SIGNING_KEY_ROLES)
        holder = _holder(holder, "the private key")
        key = SigningKey(
            key_id=key_id(public_pem),
            public_pem=public_pem,
            role=parsed,
            holder=holder,
            created_at=utcnow(),
            created_by=actor,
        )
        return self._store.access.add_signing_key(key, actor)

    def revoke_signing_key(self, key: str) -> SigningKey:
        """Raises:
        PermissionDenied: not an admin.
        NotFound: no such key.
        """
        return self._store.access.revoke_signing_key(key, self._authorize(Action.MANAGE_KEYS))

    def list_signing_keys(self) -> list[SigningKey]:
        return self._store.access.signing_keys()
