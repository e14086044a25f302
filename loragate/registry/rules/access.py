"""Who may do what: roles, the actions they allow, API tokens and the principal behind a call.

Five roles split the pipeline so that no single credential can take an adapter from a
training job to traffic: ``training`` registers, ``signing`` validates, signs and moves
staging→canary, ``activation`` judges canaries (the evaluation runs as it), promotes
canary→production, rolls back and signs off,
``fleet`` makes the replicas serve what the pointers say (reconcile, the hot pins the traffic
watch chooses), and ``admin`` manages tokens, keys, bases and the fleet -- which replicas are
in it is a person's decision -- and pins adapters.

``admin`` is a person's role and lives on no worker: it can mint any token, a person's
activation token included, so whoever holds it can sign off a production move. The
machines' roles -- ``fleet`` above all, which runs on a schedule beside the replicas -- can
mint nothing and approve nothing. A token is bound to one role and,
optionally, to a pattern of adapter names (``acme/*``) that limits the adapters it may act
on; a namespace-bound token cannot do fleet-wide work.

A token reads ``lgt_<id>_<secret>``: the id finds its row, only the SHA-256 of the secret
is stored (the secret has 256 bits of entropy, so a slow hash would add nothing), and the
secret is compared in constant time. The same roles exist in Postgres (migration 0006;
``fleet`` since 0010), so a process holding one role's database credentials cannot do
another role's writes either (``registry/db/users.py``).
"""

from __future__ import annotations

import fnmatch
import hashlib
import hmac
import re
import secrets
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from loragate.registry.errors import ErrorCode, InvalidInput, PermissionDenied


class TokenKind(StrEnum):
    """Who holds a token: a person, or a work pool of the pipeline. A pipeline token is never
    issued an approval code, so it moves production only on a person's sign-off."""

    PERSON = "person"
    PIPELINE = "pipeline"


class Role(StrEnum):
    TRAINING = "training"
    SIGNING = "signing"
    ACTIVATION = "activation"
    FLEET = "fleet"
    ADMIN = "admin"


class Action(StrEnum):
    REGISTER = "register"  # a new version, or a golden set for an adapter
    VALIDATE = "validate"  # record a shadow-validation result
    SIGN = "sign"
    PROMOTE_CANARY = "promote to canary"
    WATCH_CANARY = "run the canary watch"  # open windows, their shares and sign-off claims
    JUDGE_CANARY = "record a canary verdict"  # observations and the moves they decide
    WITHDRAW_CANARY = "withdraw a canary"
    PROMOTE_PRODUCTION = "promote to production"
    ROLLBACK_PRODUCTION = "roll back production"
    APPROVE = "sign off a production promotion"
    MANAGE_TOKENS = "manage tokens"
    MANAGE_KEYS = "manage signing keys"
    MANAGE_FLEET = "manage the fleet"  # reconcile, the hot pins; never which replicas there are
    MANAGE_REPLICAS = "add or remove a replica"  # a person's: every evaluation believes its figures
    PIN_ADAPTERS = "pin adapters"  # a person's pins; the traffic watch's hot pins are MANAGE_FLEET
    MANAGE_BASES = "manage base models"
    COLLECT_GARBAGE = "collect garbage"


PERMISSIONS: dict[Role, frozenset[Action]] = {
    Role.TRAINING: frozenset({Action.REGISTER}),
    Role.SIGNING: frozenset(
        {Action.VALIDATE, Action.SIGN, Action.PROMOTE_CANARY, Action.WATCH_CANARY, Action.WITHDRAW_CANARY}
    ),
    Role.ACTIVATION: frozenset(
        {
            Action.PROMOTE_PRODUCTION,
            Action.ROLLBACK_PRODUCTION,
            Action.APPROVE,
            Action.WATCH_CANARY,
            Action.JUDGE_CANARY,
            Action.WITHDRAW_CANARY,
        }
    ),
    # the fleet pool's worker: drive the replicas, read the registry; never tokens, keys or a sign-off
    Role.FLEET: frozenset({Action.MANAGE_FLEET}),
    Role.ADMIN: frozenset(
        {
            Action.MANAGE_TOKENS,
            Action.MANAGE_KEYS,
            Action.MANAGE_FLEET,
            Action.MANAGE_REPLICAS,
            Action.PIN_ADAPTERS,
            Action.MANAGE_BASES,
            Action.COLLECT_GARBAGE,
        }
    ),
}

TOKEN_PREFIX = "lgt"
_TOKEN = re.compile(r"^lgt_([0-9a-f]{12})_([A-Za-z0-9_-]{43})$")
_NAMESPACE = re.compile(r"^[a-z0-9][a-z0-9._-]*(/[a-z0-9*][a-z0-9._*-]*)*$")


def roles_allowed(action: Action) -> list[Role]:
    return [role for role, actions in PERMISSIONS.items() if action in actions]


# the roles a signing key may be registered for: the fleet signs nothing (and its database
# CHECK on signing_keys has no 'fleet')
SIGNING_KEY_ROLES = (Role.TRAINING, Role.SIGNING, Role.ACTIVATION, Role.ADMIN)


def parse_role(value: str, field: str = "role", allowed: tuple[Role, ...] = tuple(Role)) -> Role:
    """Raises:
    InvalidInput: INVALID_ROLE, not one of the ``allowed`` roles.
    """
    if value not in {r.value for r in allowed}:
        raise InvalidInput(
            f"role must be one of {', '.join(r.value for r in allowed)}, not {value!r}",
            code=ErrorCode.INVALID_ROLE,
            field=field,
        )
    return Role(value)


def check_namespace(pattern: str | None) -> str | None:
    """A namespace pattern: ``acme/*``, ``acme/tiny-llama/*`` or one full name.

    Raises:
        InvalidInput: INVALID_NAMESPACE for anything else (``*`` alone would be no limit at all).
    """
    if pattern is None:
        return None
    if not _NAMESPACE.match(pattern) or "/" not in pattern:
        raise InvalidInput(
            f"namespace must look like acme/* or acme/tiny-llama/*, not {pattern!r}",
            code=ErrorCode.INVALID_NAMESPACE,
            field="namespace",
        )
    return pattern


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


@dataclass(frozen=True)
class IssuedToken:
    token_id: str
    secret_hash: str
    token: str  # shown once, never stored

    def __repr__(self) -> str:
        return f"IssuedToken(token_id={self.token_id!r})"


def issue_token() -> IssuedToken:
    token_id = secrets.token_hex(6)
    secret = secrets.token_urlsafe(32)
    return IssuedToken(token_id, hash_secret(secret), f"{TOKEN_PREFIX}_{token_id}_{secret}")


def split_token(token: str) -> tuple[str, str]:
    """(token id, secret) of a presented token.

    Raises:
        PermissionDenied: not a loragate token (the message never repeats it).
    """
    match = _TOKEN.match(token.strip())
    if match is None:
        raise PermissionDenied("the token is not a loragate token (lgt_<id>_<secret>)", field="LORAGATE_TOKEN")
    return match.group(1), match.group(2)


def secret_matches(presented_hash: str, stored_hash: str) -> bool:
    return hmac.compare_digest(presented_hash, stored_hash)


@dataclass(frozen=True, kw_only=True)
class Issued:
    """What tokens and signing keys share: the role they act for, who holds them, who
    issued them and when, and whether they were revoked (never deleted)."""

    role: Role
    holder: str
    created_at: datetime
    created_by: str
    revoked_at: datetime | None = None

    @property
    def active(self) -> bool:
        return self.revoked_at is None

    @property
    def status(self) -> str:
        return "active" if self.active else "revoked"

    def issue_dict(self) -> dict[str, object]:
        return {
            "role": self.role.value,
            "holder": self.holder,
            "created_at": self.created_at.isoformat(),
            "created_by": self.created_by,
            "revoked_at": self.revoked_at.isoformat() if self.revoked_at else None,
        }


@dataclass(frozen=True, kw_only=True)
class TokenRecord(Issued):
    token_id: str
    namespace: str | None
    kind: TokenKind = TokenKind.PERSON

    def as_dict(self) -> dict[str, object]:
        return {"token_id": self.token_id, "namespace": self.namespace, "kind": self.kind.value, **self.issue_dict()}


@dataclass(frozen=True)
class Principal:
    """Who is calling: the roles they hold, the adapters they may touch, the name the audit
    log records."""

    actor: str
    roles: frozenset[Role]
    namespace: str | None = None
    token_id: str | None = None
    holder: str | None = None  # the token's holder: who signs off when this principal does
    kind: TokenKind | None = None  # None: in process, no token
    # what proves the token to the database's own checks (approval codes on Postgres)
    token_secret: str | None = field(default=None, repr=False, compare=False)

    @classmethod
    def of_token(cls, record: TokenRecord, secret: str | None = None) -> Principal:
        return cls(
            actor=f"{record.holder} ({record.role.value} token {record.token_id})",
            roles=frozenset({record.role}),
            namespace=record.namespace,
            token_id=record.token_id,
            holder=record.holder,
            kind=record.kind,
            token_secret=secret,
        )

    @classmethod
    def in_process(cls, actor: str) -> Principal:
        """Every role, for code that already holds the registry's database credentials and
        calls ``Registry`` directly (tests, benchmarks). The CLI and the flows never use it:
        they authenticate a token."""
        return cls(actor=actor, roles=frozenset(Role))

    @property
    def owner_in_process(self) -> bool:
        """Made by ``in_process``: the registry's owner, who holds its database credentials
        and no token -- limited by no role's rule, as the database's owner is not."""
        return self.token_id is None and self.kind is None

    def covers(self, name: str | None) -> bool:
        if self.namespace is None:
            return True
        return name is not None and fnmatch.fnmatchcase(name, self.namespace)

    def may(self, action: Action, name: str | None = None) -> bool:
        return any(action in PERMISSIONS[role] for role in self.roles) and self.covers(name)

    def require(self, action: Action, name: str | None = None) -> None:
        """Raises:
        PermissionDenied: no role held allows ``action``, or ``name`` is outside the
            namespace (fleet-wide actions, ``name`` None, need a token without one).
        """
        if not any(action in PERMISSIONS[role] for role in self.roles):
            held = ", ".join(sorted(r.value for r in self.roles)) or "no role"
            needed = " or ".join(r.value for r in roles_allowed(action))
            raise PermissionDenied(f"{self.actor} holds {held}; to {action.value} takes {needed}", field="role")
        if not self.covers(name):
            what = name if name is not None else "fleet-wide work"
            raise PermissionDenied(
                f"{self.actor} is limited to {self.namespace}; {what} is outside it", field="namespace"
            )


@dataclass(frozen=True, kw_only=True)
class SigningKey(Issued):
    key_id: str
    public_pem: bytes

    def as_dict(self) -> dict[str, object]:
        return {"key_id": self.key_id, **self.issue_dict()}


@dataclass(frozen=True)
class VersionSignature:
    """A signature over a version's bundle and the validation report it passed with."""

    id: int
    version_id: str
    key_id: str
    validation_run_id: int
    report_sha256: str
    signature: bytes
    signed_at: datetime
    signed_by: str

    def as_dict(self) -> dict[str, object]:
        return {
            "version_id": self.version_id,
            "key_id": self.key_id,
            "validation_run_id": self.validation_run_id,
            "report_sha256": self.report_sha256,
            "signed_at": self.signed_at.isoformat(),
            "signed_by": self.signed_by,
        }
