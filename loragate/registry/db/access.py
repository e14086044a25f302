"""Who may act: API tokens (only the SHA-256 of a secret is stored), the public halves of
signing keys, and the signatures made with them over a version and its validation run.
Revoking marks a row once; nothing is ever deleted."""

from __future__ import annotations

import dataclasses
from typing import Any

from sqlalchemy import insert, select, update
from sqlalchemy.exc import IntegrityError

from loragate.registry.db.database import Database, utc, utc_or_none
from loragate.registry.db.schema import api_tokens, signing_keys, version_signatures
from loragate.registry.errors import AlreadyExists, NotFound
from loragate.registry.records.adapters import utcnow
from loragate.registry.rules.access import IssuedToken, Role, SigningKey, TokenKind, TokenRecord, VersionSignature


def _issued_fields(row: Any) -> dict[str, Any]:
    """The columns api_tokens and signing_keys share (``access.Issued``)."""
    return {
        "role": Role(row.role),
        "holder": row.holder,
        "created_at": utc(row.created_at),
        "created_by": row.created_by,
        "revoked_at": utc_or_none(row.revoked_at),
    }


def token_from_row(row: Any) -> TokenRecord:
    return TokenRecord(token_id=row.token_id, namespace=row.namespace, kind=TokenKind(row.kind), **_issued_fields(row))


def key_from_row(row: Any) -> SigningKey:
    return SigningKey(key_id=row.key_id, public_pem=row.public_pem.encode(), **_issued_fields(row))


def signature_from_row(r: Any) -> VersionSignature:
    return VersionSignature(
        id=r.id,
        version_id=r.version_id,
        key_id=r.key_id,
        validation_run_id=r.validation_run_id,
        report_sha256=r.report_sha256,
        signature=r.signature.encode(),
        signed_at=utc(r.signed_at),
        signed_by=r.signed_by,
    )


class AccessRepository:
    def __init__(self, db: Database):
        self.db = db

    # -- tokens -------------------------------------------------------------------

    def create_token(
        self,
        issued: IssuedToken,
        role: Role,
        namespace: str | None,
        holder: str,
        actor: str,
        kind: TokenKind = TokenKind.PERSON,
    ) -> TokenRecord:
        now = utcnow()
        with self.db.write() as conn:
            conn.execute(
                insert(api_tokens).values(
                    token_id=issued.token_id,
                    secret_sha256=issued.secret_hash,
                    role=role.value,
                    namespace=namespace,
                    holder=holder,
                    created_at=now,
                    created_by=actor,
                    kind=kind.value,
                )
            )
            self.db.audit(
                conn,
                actor=actor,
                action="token_created",
                adapter_name=None,
                to_value=issued.token_id,
                details={"role": role.value, "namespace": namespace, "holder": holder, "kind": kind.value},
                at=now,
            )
        return TokenRecord(
            token_id=issued.token_id,
            namespace=namespace,
            kind=kind,
            role=role,
            holder=holder,
            created_at=now,
            created_by=actor,
        )

    def token(self, token_id: str) -> tuple[TokenRecord, str] | None:
        """The token's record and the SHA-256 of its secret."""
        with self.db.reader.connect() as conn:
            row = conn.execute(select(api_tokens).where(api_tokens.c.token_id == token_id)).first()
        return None if row is None else (token_from_row(row), row.secret_sha256)

    def tokens(self) -> list[TokenRecord]:
        with self.db.reader.connect() as conn:
            rows = conn.execute(select(api_tokens).order_by(api_tokens.c.created_at, api_tokens.c.token_id))
            return [token_from_row(r) for r in rows]

    def revoke_token(self, token_id: str, actor: str) -> TokenRecord:
        """Raises:
        NotFound: no such token.
        """
        self._revoke(api_tokens.c.token_id, token_id, actor, "token_revoked")
        found = self.token(token_id)
        if found is None:
            raise NotFound(f"no token {token_id!r}", field="token_id")
        return found[0]

    def _revoke(self, key_column: Any, value: str, actor: str, action: str) -> None:
        """Mark a token or a key revoked, once (revoking again changes nothing)."""
        table = key_column.table
        now = utcnow()
        with self.db.write() as conn:
            changed = conn.execute(
                update(table)
                .where(key_column == value, table.c.revoked_at.is_(None))
                .values(revoked_at=now, revoked_by=actor)
            ).rowcount
            if changed:
                self.db.audit(
                    conn,
                    actor=actor,
                    action=action,
                    adapter_name=None,
                    to_value=value[:64],
                    details={"id": value},
                    at=now,
                )

    # -- signing keys -------------------------------------------------------------

    def add_signing_key(self, key: SigningKey, actor: str) -> tuple[SigningKey, bool]:
        """Register a public key for a role; the same key again is a no-op.

        Raises:
            AlreadyExists: the key is registered for another role or holder.
        """
        existing = self.signing_key(key.key_id)
        if existing is not None:
            if (existing.role, existing.holder) != (key.role, key.holder):
                raise AlreadyExists(
                    f"key {key.key_id} is registered to {existing.holder} for {existing.role.value}", field="public_key"
                )
            return existing, False
        now = utcnow()
        try:
            with self.db.write() as conn:
                conn.execute(
                    insert(signing_keys).values(
                        key_id=key.key_id,
                        role=key.role.value,
                        public_pem=key.public_pem.decode(),
                        holder=key.holder,
                        created_at=now,
                        created_by=actor,
                    )
                )
                self.db.audit(
                    conn,
                    actor=actor,
                    action="key_added",
                    adapter_name=None,
                    to_value=key.key_id[:64],
                    details={"key_id": key.key_id, "role": key.role.value, "holder": key.holder},
                    at=now,
                )
        except IntegrityError as e:
            raise AlreadyExists(f"key {key.key_id} was added meanwhile", field="public_key") from e
        return dataclasses.replace(key, created_at=now, created_by=actor), True

    def signing_key(self, key_id: str) -> SigningKey | None:
        with self.db.reader.connect() as conn:
            row = conn.execute(select(signing_keys).where(signing_keys.c.key_id == key_id)).first()
        return None if row is None else key_from_row(row)

    def signing_keys(self) -> list[SigningKey]:
        with self.db.reader.connect() as conn:
            rows = conn.execute(select(signing_keys).order_by(signing_keys.c.created_at, signing_keys.c.key_id))
            return [key_from_row(r) for r in rows]

    def revoke_signing_key(self, key_id: str, actor: str) -> SigningKey:
        """Raises:
        NotFound: no such key.
        """
        self._revoke(signing_keys.c.key_id, key_id, actor, "key_revoked")
        key = self.signing_key(key_id)
        if key is None:
            raise NotFound(f"no signing key {key_id!r}", field="key_id")
        return key

    # -- signatures ---------------------------------------------------------------

    def record_signature(
        self,
        version_id: str,
        adapter_name: str,
        key_id: str,
        run_id: int,
        report_sha256: str,
        signature: bytes,
        actor: str,
    ) -> tuple[VersionSignature, bool]:
        """Store a signature; the same version, key and validation run again is a no-op."""
        for existing in self.signatures(version_id):
            if (existing.key_id, existing.validation_run_id) == (key_id, run_id):
                return existing, False
        now = utcnow()
        with self.db.write() as conn:
            conn.execute(
                insert(version_signatures).values(
                    version_id=version_id,
                    key_id=key_id,
                    validation_run_id=run_id,
                    report_sha256=report_sha256,
                    signature=signature.decode(),
                    signed_at=now,
                    signed_by=actor,
                )
            )
            self.db.audit(
                conn,
                actor=actor,
                action="signed",
                adapter_name=adapter_name,
                version_id=version_id,
                details={"key_id": key_id, "validation_run_id": run_id, "report_sha256": report_sha256},
                at=now,
            )
        return next(s for s in self.signatures(version_id) if (s.key_id, s.validation_run_id) == (key_id, run_id)), True

    def signatures(self, version_id: str) -> list[VersionSignature]:
        """Oldest first."""
        with self.db.reader.connect() as conn:
            rows = conn.execute(
                select(version_signatures)
                .where(version_signatures.c.version_id == version_id)
                .order_by(version_signatures.c.id)
            )
            return [signature_from_row(r) for r in rows]
