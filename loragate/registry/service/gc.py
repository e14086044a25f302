"""Garbage: what crashed writes left behind (scratch files of writers that are gone, blobs
no version or golden set refers to), found and removed safely while others register."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loragate.registry.rules.access import Action
from loragate.registry.service.base import RegistryBase
from loragate.registry.storage.blobs import StoredBlob
from loragate.registry.storage.scratch import Litter, find_litter, remove


@dataclass(frozen=True)
class GcReport:
    litter: list[Litter]
    orphans: list[StoredBlob]
    removed: bool
    freed_bytes: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "removed": self.removed,
            "freed_bytes": self.freed_bytes,
            "litter": [
                {"path": str(i.path), "bytes": i.bytes, "age_s": round(i.age_s), "why": i.why} for i in self.litter
            ],
            "orphan_blobs": [{"digest": b.digest, "bytes": b.size, "age_s": round(b.age_s)} for b in self.orphans],
        }


class GcMixin(RegistryBase):
    def gc(self, *, dry_run: bool = False) -> GcReport:
        """Find, and unless ``dry_run`` remove, what crashed writes left behind: scratch
        files of writers that are gone or older than the litter age, and blobs no version or
        golden set refers to that are older than it too.

        Safe while others register: a live writer's scratch entries and any blob younger
        than the litter age are kept, references are read again right before blobs are
        deleted, and a register checks its blobs once more after it commits.
        """
        actor = self._authorize(Action.COLLECT_GARBAGE)
        age = self.settings.litter_age_s
        store_litter = self._artifacts.litter(age)
        scratch_litter = find_litter(Path(tempfile.gettempdir()), age)
        litter = store_litter + scratch_litter
        referenced = self._store.audit.referenced_digests()
        candidates = [b for b in self._artifacts.blobs() if b.digest not in referenced and b.age_s > age]
        if candidates and not dry_run:
            referenced = self._store.audit.referenced_digests()  # anything committed meanwhile is kept
        orphans = [b for b in candidates if b.digest not in referenced]
        freed = 0
        if not dry_run:
            freed += self._artifacts.remove_litter(store_litter) + remove(scratch_litter)
            for blob in orphans:
                self._artifacts.delete(blob.digest)
                freed += blob.size
            if litter or orphans:
                details = {"litter": len(litter), "orphan_blobs": len(orphans), "bytes_freed": freed}
                self._store.audit.record_gc(actor, details)
        return GcReport(litter=litter, orphans=orphans, removed=not dry_run, freed_bytes=freed)
