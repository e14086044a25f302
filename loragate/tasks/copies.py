"""The copies a pointer move puts on replicas, made ready before it takes the adapter's lock.

Everything slow about a switch that is not talking to a replica -- downloading the bundle,
checking its bytes, verifying a production copy's signature on them, reading the golden
outputs the replicas must reproduce -- depends only on the version, not on the decision
the move makes under the lock. So ``ReadyCopies.prepare_promotion`` / ``prepare_rollback``
do it first, for the copies the move will most likely need (predicted from the adapter's
pointers read without a lock), and remember each copy by its files' stat stamps (inode,
size, mtime, ctime: any write changes the ctime). Under the lock a copy that was made ready
and whose files are unchanged costs three ``stat`` calls, and production's signature is
verified on it (``signed_copies``) rather than on stored blobs fetched there; anything the
prediction missed (the pointers moved in between) is made ready there, as before.
Correctness never rests on the prediction.

A signature verified before the lock is as good as one verified under it: revoking a key
or re-validating a version does not take the adapter's lock, so the check was never
serialized with them; it only moves a few seconds earlier.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loragate.registry.errors import LoragateError
from loragate.registry.records.adapters import Adapter
from loragate.registry.rules.fleet import AdapterPointers, Placement, Replica, ReplicaRole, desired_placements
from loragate.registry.rules.lifecycle import Pointer
from loragate.registry.rules.names import AdapterName
from loragate.registry.service import Registry
from loragate.registry.storage.bundle_files import BUNDLE_FILES
from loragate.registry.storage.copies import stat_stamp


def materialize_for(registry: Registry, replica: Replica, placement: Placement) -> None:
    """Write the version where the replica loads it from; a production replica's copy has
    its signature verified on those very bytes, not only on the stored blobs.

    Raises:
        SignatureInvalid: the copy does not verify (the replica is not touched).
    """
    path = registry.materialize(placement.version_id, Path(placement.path))
    if replica.role == ReplicaRole.PRODUCTION:
        registry.verify_signature(placement.version_id, bundle_dir=path)


def _stamps(path: Path) -> list[list[int]] | None:
    try:
        return [stat_stamp(os.stat(path / name, follow_symlinks=False)) for name in BUNDLE_FILES]
    except OSError:
        return None


@dataclass
class ReadyCopies:
    """The copies made ready for one pointer move, and the golden outputs read for it."""

    registry: Registry
    # (copy path, signature verified on it) -> its files' stamps when it was checked
    _checked: dict[tuple[str, bool], list[list[int]]] = field(default_factory=dict)
    _expected: dict[str, Any] = field(default_factory=dict)
    made_ready: int = 0  # copies materialized and checked (the work a prepared move avoids under its lock)

    def prepare_promotion(self, name: str, version_id: str, stage: str) -> None:
        """Make ready what promoting ``version_id`` of ``name`` to ``stage`` would place."""
        if stage in (Pointer.CANARY.value, Pointer.PRODUCTION.value):
            self._prepare(name, lambda adapter: {stage: version_id})

    def prepare_rollback(self, name: str, stage: str) -> None:
        """Make ready what rolling ``name``'s ``stage`` back would place: production's
        previous version, or, for a canary withdrawn, production on the canary replicas."""
        if stage == Pointer.PRODUCTION.value:
            self._prepare(name, lambda adapter: {"production": adapter.previous})
        elif stage == Pointer.CANARY.value:
            self._prepare(name, lambda adapter: {"canary": None})

    def _prepare(self, name: str, changes: Callable[[Adapter], dict[str, str | None]]) -> None:
        """Best effort: a copy that cannot be made ready here is left to the move, which
        meets the same error under its lock and reports it."""
        try:
            adapter = self.registry.get_adapter(name)
            base = AdapterName.parse(name).base
        except LoragateError:  # the move reports an unknown adapter or a bad name itself
            return
        current = AdapterPointers(name, base, adapter.canary, adapter.production)
        wanted = dataclasses.replace(current, **changes(adapter))  # type: ignore[arg-type]
        for replica in self.registry.list_replicas(base):
            after = desired_placements(replica, [wanted]).get(name)
            if after is None or after == desired_placements(replica, [current]).get(name):
                continue
            try:
                self.ready(replica, after)
                self.expected_outputs(after.version_id)
            except (LoragateError, OSError):
                continue

    def ready(self, replica: Replica, placement: Placement) -> None:
        """The copy ``replica`` loads ``placement`` from exists and is checked: at once when
        it was checked for this move and is unchanged since, else in full
        (``materialize_for``)."""
        signed = replica.role == ReplicaRole.PRODUCTION
        key = (placement.path, signed)
        known = self._checked.get(key)
        if known is not None and known == _stamps(Path(placement.path)):
            return
        materialize_for(self.registry, replica, placement)
        self.made_ready += 1
        stamps = _stamps(Path(placement.path))
        if stamps is not None:
            self._checked[key] = stamps

    def signed_copies(self) -> dict[str, Path]:
        """A copy of each version whose signature was verified on it, unchanged since
        (version -> directory): the pointer move verifies production's signature on it
        rather than fetch the stored blobs under the lock."""
        found: dict[str, Path] = {}
        for (path, signed), stamps in self._checked.items():
            if signed and stamps == _stamps(Path(path)):
                found.setdefault(Path(path).name, Path(path))  # a copy's path ends in its version
        return found

    def expected_outputs(self, version_id: str) -> Any:
        """What shadow validation recorded for ``version_id`` (read once per move)."""
        if version_id not in self._expected:
            self._expected[version_id] = self.registry.expected_outputs(version_id)
        return self._expected[version_id]
