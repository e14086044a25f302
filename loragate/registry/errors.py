"""Typed errors of the registry.

Every failure the registry reports carries an ``ErrorCode`` and, where one field of the
input is at fault, that field's name. Callers branch on the class or the code, never on
the message; the edges (CLI exit codes, HTTP statuses) translate the class once.
"""

from __future__ import annotations

from enum import StrEnum


class ErrorCode(StrEnum):
    # bad input: the caller can fix it
    INVALID_NAME = "invalid_name"
    INVALID_MANIFEST = "invalid_manifest"
    INVALID_ADAPTER_CONFIG = "invalid_adapter_config"
    MANIFEST_MISMATCH = "manifest_mismatch"
    INVALID_WEIGHTS = "invalid_weights"
    DIGEST_MISMATCH = "digest_mismatch"
    INVALID_BUNDLE = "invalid_bundle"
    TOO_LARGE = "too_large"
    UNKNOWN_BASE = "unknown_base"
    BASE_MISMATCH = "base_mismatch"
    INVALID_BASE = "invalid_base"
    RANK_LIMIT = "rank_limit"
    INVALID_SETTING = "invalid_setting"
    INVALID_GOLDEN_SET = "invalid_golden_set"
    NOT_FOUND = "not_found"
    UNKNOWN_ADAPTER = "unknown_adapter"  # a name no adapter of the registry has (pinning one)
    HOT_PINS_OVER_LIMIT = "hot_pins_over_limit"  # more hot pins of a base than its limit leaves
    ALREADY_EXISTS = "already_exists"
    ILLEGAL_TRANSITION = "illegal_transition"
    VALIDATION_REQUIRED = "validation_required"
    SCAN_REVIEW_UNACKNOWLEDGED = "scan_review_unacknowledged"
    # production for a canary whose window has not decided, without a person's override
    OVERRIDE_REQUIRED = "override_required"
    NOT_INITIALIZED = "not_initialized"
    # live traffic: a canary share outside [0, 1]; feedback that names no known request or outcome
    INVALID_SHARE = "invalid_share"
    INVALID_FEEDBACK = "invalid_feedback"
    # the system, not the caller
    ARTIFACT_CORRUPTED = "artifact_corrupted"
    CONCURRENT_UPDATE = "concurrent_update"
    BASE_DRIFT = "base_drift"
    ARTIFACT_STORE_UNAVAILABLE = "artifact_store_unavailable"
    DATABASE_UNAVAILABLE = "database_unavailable"
    DATABASE_BUSY = "database_busy"  # a session limit: a lock or a statement waited too long
    # the serving fleet
    REPLICA_UNAVAILABLE = "replica_unavailable"
    REPLICA_REFUSED = "replica_refused"
    REPLICA_UNKNOWN_ADAPTER = "replica_unknown_adapter"
    REPLICA_UNVERIFIED = "replica_unverified"  # an answer no holder of the fleet's key signed
    DEPLOY_FAILED = "deploy_failed"
    # who may do what, and signatures
    PERMISSION_DENIED = "permission_denied"
    MISSING_CREDENTIAL = "missing_credential"
    APPROVAL_CODE_INVALID = "approval_code_invalid"
    APPROVAL_CODE_USED = "approval_code_used"
    APPROVAL_CODE_EXPIRED = "approval_code_expired"
    APPROVAL_CODE_MISMATCH = "approval_code_mismatch"
    APPROVAL_CODE_REVOKED = "approval_code_revoked"
    APPROVAL_CODE_SELF = "approval_code_self"
    APPROVAL_REQUIRED = "approval_required"
    # a canary share above LORAGATE_CANARY_MAX_SHARE without a person's sign-off pending
    SHARE_ABOVE_CAP = "share_above_cap"
    INVALID_ROLE = "invalid_role"
    INVALID_NAMESPACE = "invalid_namespace"
    INVALID_HOLDER = "invalid_holder"
    # free text a person writes (a reason, a holder) with characters a terminal obeys
    INVALID_TEXT = "invalid_text"
    SIGNATURE_REQUIRED = "signature_required"
    SIGNATURE_INVALID = "signature_invalid"


class LoragateError(Exception):
    """Base of every error loragate raises on purpose."""

    default_code = ErrorCode.INVALID_MANIFEST

    def __init__(self, message: str, *, code: ErrorCode | None = None, field: str | None = None):
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code
        self.field = field

    def one_line(self) -> str:
        where = f" [{self.field}]" if self.field else ""
        return f"{self.code.value}{where}: {' '.join(self.message.split())}"

    def as_dict(self) -> dict:
        return {"code": self.code.value, "field": self.field, "message": self.message}


class InvalidInput(LoragateError):
    """The request is wrong; nothing was changed."""


class NotFound(InvalidInput):
    default_code = ErrorCode.NOT_FOUND


class AlreadyExists(InvalidInput):
    default_code = ErrorCode.ALREADY_EXISTS


class IllegalTransition(InvalidInput):
    default_code = ErrorCode.ILLEGAL_TRANSITION


class PermissionDenied(LoragateError):
    """No token, an unknown or revoked one, or a role or namespace that does not allow the
    operation; nothing was changed."""

    default_code = ErrorCode.PERMISSION_DENIED

    def one_line(self) -> str:
        return f"permission denied: {' '.join(self.message.split())}"


class ApprovalRefused(PermissionDenied):
    """A sign-off whose approval code does not prove it: forged, used, expired, issued for
    another window, decision or reviewer, to a revoked token, or to the acting token."""

    default_code = ErrorCode.APPROVAL_CODE_INVALID


class IntegrityFailure(LoragateError):
    """Stored bytes or a pinned base no longer match their recorded digest."""

    default_code = ErrorCode.ARTIFACT_CORRUPTED


class SignatureInvalid(IntegrityFailure):
    """A signature does not verify: a changed byte in a signed part, an unknown or revoked
    key, a key not registered for signing, or a signature made over another version."""

    default_code = ErrorCode.SIGNATURE_INVALID


class Unavailable(LoragateError):
    """A component the registry needs (database, artifact store) cannot be reached in time."""

    default_code = ErrorCode.DATABASE_UNAVAILABLE


class ReplicaError(LoragateError):
    """A vLLM replica could not be reached in time, or refused a request (by status and
    error type, never by message text)."""

    default_code = ErrorCode.REPLICA_REFUSED

    def __init__(self, message: str, *, code: ErrorCode | None = None, field: str | None = None, status: int = 0):
        super().__init__(message, code=code, field=field)
        self.status = status


class DeployFailed(LoragateError):
    """A fleet switch failed on a replica; every replica was put back as it was."""

    default_code = ErrorCode.DEPLOY_FAILED


class ConcurrentUpdate(LoragateError):
    """Another writer moved the same adapter first; the operation may be retried."""

    default_code = ErrorCode.CONCURRENT_UPDATE
