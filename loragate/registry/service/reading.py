"""Reading the registry as it is: versions, adapters and their pointers, the audit log, one
version described in full. No token needed."""

from __future__ import annotations

from typing import Any

from loragate.registry.errors import ErrorCode, InvalidInput, NotFound
from loragate.registry.records.adapters import Adapter, AdapterVersion, AuditEvent, utcnow
from loragate.registry.records.progress import Waiting
from loragate.registry.rules.lifecycle import Pointer
from loragate.registry.rules.names import AdapterName
from loragate.registry.service.base import RegistryBase


class ReadingMixin(RegistryBase):
    def get_version(self, version_id: str) -> AdapterVersion:
        """Raises:
        NotFound: no such version.
        """
        return self._store.versions.get(version_id)

    def list_versions(self, name: str | None = None) -> list[AdapterVersion]:
        """Every version, or those of ``name``, oldest first.

        Raises:
            NotFound: ``name`` is given and no such adapter exists.
        """
        if name is not None:
            self._store.pointers.adapter(name)
        return self._store.versions.versions(name)

    def waiting(self, longer_than_s: float = 0.0) -> list[Waiting]:
        """Every version that has waited for a gate (``records/progress.py``) longer than
        ``longer_than_s``, oldest wait first."""
        now = utcnow()
        return [w for w in self._store.progress.waiting() if w.waited_s(now) >= longer_than_s]

    def get_adapter(self, name: str) -> Adapter:
        """The logical adapter and its pointers.

        Raises:
            NotFound: no such adapter.
        """
        return self._store.pointers.adapter(name)

    def history(self, name: str) -> list[AuditEvent]:
        """The audit log of a logical adapter, oldest first.

        Raises:
            NotFound: no such adapter.
        """
        self._store.pointers.adapter(name)
        return self._store.audit.history(name)

    def resolve_stage(self, name: str, stage: str = "production") -> str:
        """The version a pointer names.

        Raises:
            InvalidInput: INVALID_NAME for a malformed name, INVALID_MANIFEST for an unknown stage.
            NotFound: no such adapter, or nothing at that pointer.
        """
        AdapterName.parse(name)
        try:
            pointer = Pointer(stage)
        except ValueError as e:
            raise InvalidInput(
                f"stage {stage!r} is not one of {[p.value for p in Pointer]}",
                code=ErrorCode.INVALID_MANIFEST,
                field="stage",
            ) from e
        version_id = self._store.pointers.resolve(name, pointer.value)
        if version_id is None:
            self._store.pointers.adapter(name)  # NotFound when the adapter itself is unknown
            raise NotFound(f"{name} has no {stage} version", field="stage")
        return version_id

    def describe_version(self, version_id: str) -> dict[str, Any]:
        """One version: its columns, the pointers naming it, its manifest with the lifecycle
        fields filled in, and its validation runs.

        Raises:
            NotFound: no such version.
        """
        version = self._store.versions.get(version_id)
        runs = self._store.validation.runs(version_id)
        adapter = self._store.pointers.adapter(version.name)
        pointers = [p.value for p in Pointer if adapter.pointer(p) == version_id]
        deployed_at = self._store.pointers.moved_at(version.name, "production") if "production" in pointers else None
        report = runs[-1].report if runs else None
        return {
            **version.as_dict(),
            "pointers": pointers,
            "manifest": version.manifest_view(report, deployed_at),
            "validation_runs": [
                {k: r.as_dict()[k] for k in ("id", "status", "golden_set_digest", "output_sha256", "finished_at")}
                for r in runs
            ],
        }
