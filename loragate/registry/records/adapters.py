"""Plain domain objects returned by the store; database rows never leave a session."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

from loragate.registry.records.reports import ValidationReport
from loragate.registry.rules.lifecycle import Pointer, Stage, ValidationStatus


def utcnow() -> datetime:
    return datetime.now(UTC)


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


@dataclass(frozen=True)
class AdapterVersion:
    version_id: str
    name: str
    content_address: str
    identity_sha256: str
    manifest_sha256: str
    weights_sha256: str
    weights_size: int
    adapter_config_sha256: str
    base_model_id: str
    base_model_commit: str
    lora_rank: int
    stage: Stage
    validation_status: ValidationStatus
    previous_version: str | None
    manifest: dict[str, Any]
    created_at: datetime
    created_by: str

    @property
    def blob_digests(self) -> tuple[str, str, str]:
        """The hex digests of the version's blobs: weights, adapter config, manifest."""
        return self.weights_sha256, self.adapter_config_sha256, self.manifest_sha256

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["created_at"] = _iso(self.created_at)
        return d

    def manifest_view(
        self, validation_report: ValidationReport | None = None, deployed_at: datetime | None = None
    ) -> dict[str, Any]:
        """The stored manifest with the lifecycle fields the registry owns filled in."""
        view = dict(self.manifest)
        view["validation_status"] = self.validation_status.value
        view["validation_report"] = validation_report.to_json() if validation_report else None
        view["deployment_timestamp"] = _iso(deployed_at)
        return view


@dataclass(frozen=True)
class Adapter:
    name: str
    canary: str | None
    production: str | None
    previous: str | None
    revision: int
    version_count: int
    created_at: datetime

    def pointer(self, pointer: Pointer) -> str | None:
        return {Pointer.CANARY: self.canary, Pointer.PRODUCTION: self.production, Pointer.PREVIOUS: self.previous}[
            pointer
        ]

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["created_at"] = _iso(self.created_at)
        return d


@dataclass(frozen=True)
class AuditEvent:
    id: int
    at: datetime
    actor: str
    action: str
    adapter_name: str | None
    version_id: str | None
    stage: str | None
    from_value: str | None
    to_value: str | None
    reason: str | None
    details: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["at"] = _iso(self.at)
        return d


@dataclass(frozen=True)
class GoldenSetRef:
    adapter_name: str
    digest: str
    case_count: int
    attached_at: datetime
    attached_by: str

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["attached_at"] = _iso(self.attached_at)
        return d


@dataclass(frozen=True)
class ValidationRun:
    id: int
    version_id: str
    status: ValidationStatus
    golden_set_digest: str | None
    output_sha256: str | None
    report: ValidationReport
    started_at: datetime
    finished_at: datetime
    actor: str

    def as_dict(self) -> dict[str, Any]:
        """The run without its report (``report.to_json()`` has that)."""
        return {
            "id": self.id,
            "version_id": self.version_id,
            "status": self.status.value,
            "golden_set_digest": self.golden_set_digest,
            "output_sha256": self.output_sha256,
            "started_at": _iso(self.started_at),
            "finished_at": _iso(self.finished_at),
            "actor": self.actor,
        }
