"""Approval codes: a sign-off that proves who gave it.

A name typed into a form proves nothing: whoever reaches the Prefect API can resume a
paused promotion as "alice", or run the rollback deployment. So a production sign-off, and
a rollback started through the pipeline, carry a code that only the holder of an activation
token for the adapter can get: ``loragate approve-code VERSION`` issues it to the caller's
own token, bound to the token's holder (the reviewer), the decision (approve, reject, or
roll back), what it decides on (the version's canary window; for a rollback the version the
stage serves now) and an expiry. It reads ``lac_<id>_<secret>``; only the SHA-256 of the
secret is stored (128 random bits: a slow hash would add nothing), and it is good once. The
flow redeems it before it records or moves anything, acting with its own activation token
-- never one the code was issued to, so the pipeline cannot sign off its own move. What
each refusal means is an error code of its own.
"""

from __future__ import annotations

import hmac
import re
import secrets
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from loragate.registry.errors import ApprovalRefused, ErrorCode, InvalidInput
from loragate.registry.rules.access import hash_secret

CODE_PREFIX = "lac"
_CODE = re.compile(r"^lac_([0-9a-f]{12})_([A-Za-z0-9_-]{22})$")
MIN_TTL_S = 30
MAX_TTL_S = 24 * 3600


class Decision(StrEnum):
    APPROVE = "approve"
    REJECT = "reject"
    ROLLBACK = "rollback"  # the stage serving the code's version goes back (production) or is withdrawn

    @classmethod
    def of(cls, approve: bool) -> Decision:
        return cls.APPROVE if approve else cls.REJECT


@dataclass(frozen=True)
class IssuedCode:
    code_id: str
    secret_hash: str
    code: str  # shown once, never stored

    def __repr__(self) -> str:
        return f"IssuedCode(code_id={self.code_id!r})"


def issue_code() -> IssuedCode:
    code_id = secrets.token_hex(6)
    secret = secrets.token_urlsafe(16)
    return IssuedCode(code_id, hash_secret(secret), f"{CODE_PREFIX}_{code_id}_{secret}")


@dataclass(frozen=True)
class PresentedCode:
    """A code as given in a form: its id, and the secret it carries (which Postgres checks
    again itself when the code is used)."""

    code_id: str
    secret: str = field(repr=False)

    @property
    def secret_hash(self) -> str:
        return hash_secret(self.secret)

    @classmethod
    def parse(cls, code: str) -> PresentedCode:
        """Raises:
        ApprovalRefused: APPROVAL_CODE_INVALID, not an approval code (never repeated back).
        """
        match = _CODE.match(code.strip())
        if match is None:
            raise ApprovalRefused(
                "the approval code is not one `loragate approve-code` issues (lac_<id>_<secret>)", field="code"
            )
        return cls(match.group(1), match.group(2))


@dataclass(frozen=True)
class ApprovalCode:
    """An issued code as stored: what it is bound to, and whether it was used."""

    code_id: str
    secret_hash: str
    window_id: int | None  # None for a rollback: it decides on a version, not a window
    version_id: str
    adapter_name: str
    token_id: str
    reviewer: str
    decision: Decision
    issued_at: datetime
    expires_at: datetime
    used_at: datetime | None = None
    used_by: str | None = None

    def __repr__(self) -> str:
        return f"ApprovalCode(code_id={self.code_id!r}, window_id={self.window_id}, reviewer={self.reviewer!r})"

    def as_dict(self) -> dict[str, object]:
        return {
            "code_id": self.code_id,
            "window_id": self.window_id,
            "version_id": self.version_id,
            "adapter_name": self.adapter_name,
            "token_id": self.token_id,
            "reviewer": self.reviewer,
            "decision": self.decision.value,
            "issued_at": self.issued_at.isoformat(),
            "expires_at": self.expires_at.isoformat(),
            "used_at": self.used_at.isoformat() if self.used_at else None,
        }


@dataclass(frozen=True)
class Redemption:
    """What a flow offers a code for: a decision on one window (a sign-off) or on the
    version a stage serves (a rollback, ``window_id`` None), in a reviewer's name (None:
    whoever the code names), made by a principal acting with ``acting_token_id``."""

    window_id: int | None
    version_id: str
    decision: Decision
    reviewer: str | None
    acting_token_id: str | None
    at: datetime

    def subject(self) -> str:
        return f"canary window {self.window_id} of {self.version_id}" if self.window_id else self.version_id


def check_redeemable(
    stored: ApprovalCode | None, presented: PresentedCode, offer: Redemption, *, token_active: bool
) -> None:
    """Whether ``presented`` may prove ``offer``; the first broken rule, else nothing.

    Raises:
        ApprovalRefused: APPROVAL_CODE_INVALID (unknown, or the secret does not match),
            APPROVAL_CODE_USED, APPROVAL_CODE_EXPIRED, APPROVAL_CODE_MISMATCH (another
            window, decision or reviewer), APPROVAL_CODE_REVOKED (its token was revoked),
            APPROVAL_CODE_SELF (issued to the very token that would act on it).
    """
    if stored is None or not hmac.compare_digest(stored.secret_hash, presented.secret_hash):
        raise ApprovalRefused(f"approval code {presented.code_id} is not one this registry issued", field="code")
    refusal: tuple[ErrorCode, str] | None = None
    if stored.used_at is not None:
        refusal = (ErrorCode.APPROVAL_CODE_USED, f"was already used at {stored.used_at.isoformat()}")
    elif stored.expires_at <= offer.at:
        refusal = (ErrorCode.APPROVAL_CODE_EXPIRED, f"expired at {stored.expires_at.isoformat()}")
    elif stored.decision != offer.decision:
        refusal = (
            ErrorCode.APPROVAL_CODE_MISMATCH,
            f"was issued to {stored.decision.value}, not to {offer.decision.value}",
        )
    elif (stored.window_id, stored.version_id) != (offer.window_id, offer.version_id):
        issued_for = f"canary window {stored.window_id} of " if stored.window_id else ""
        refusal = (
            ErrorCode.APPROVAL_CODE_MISMATCH,
            f"was issued for {issued_for}{stored.version_id}, not for {offer.subject()}",
        )
    elif offer.reviewer is not None and stored.reviewer != offer.reviewer:
        refusal = (ErrorCode.APPROVAL_CODE_MISMATCH, f"was issued to {stored.reviewer}, not to {offer.reviewer}")
    elif not token_active:
        refusal = (ErrorCode.APPROVAL_CODE_REVOKED, f"was issued to token {stored.token_id}, revoked since")
    elif stored.token_id == offer.acting_token_id:
        refusal = (
            ErrorCode.APPROVAL_CODE_SELF,
            "was issued to the token the flow acts with: nobody approves their own move",
        )
    if refusal is not None:
        code, why = refusal
        raise ApprovalRefused(f"approval code {stored.code_id} {why}", code=code, field="code")


def check_ttl(ttl_s: float) -> float:
    """Raises:
    InvalidInput: INVALID_SETTING, outside [MIN_TTL_S, MAX_TTL_S].
    """
    if not MIN_TTL_S <= ttl_s <= MAX_TTL_S:
        raise InvalidInput(
            f"an approval code lives {MIN_TTL_S} s to {MAX_TTL_S} s, not {ttl_s:g} s",
            code=ErrorCode.INVALID_SETTING,
            field="ttl",
        )
    return ttl_s
