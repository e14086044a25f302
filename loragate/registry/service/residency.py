"""The residency plan of a base as the registry knows it: the versions its replicas of one
role keep (pointers and active canary windows), each sized by its manifest against the
pinned base's ``config.json``, read from the base's files and checked against the config
hash it was pinned with, and on production the pinned adapters among them (``adapter_pins``).
Read-only; the arithmetic is ``rules/residency.py``'s."""

from __future__ import annotations

from loragate.registry.errors import ErrorCode, IntegrityFailure, InvalidInput
from loragate.registry.intake.catalog import base_directory, config_facts
from loragate.registry.intake.jsonio import loads_object
from loragate.registry.records.bases import BaseModelRecord
from loragate.registry.rules.canary import ACTIVE
from loragate.registry.rules.fleet import ReplicaRole
from loragate.registry.rules.fleet import replica_role as replica_role_of
from loragate.registry.rules.residency import (
    BaseShape,
    Residence,
    ResidencyPlan,
    ResidentVersion,
    adapter_bytes,
    resident_set,
)
from loragate.registry.service.base import RegistryBase
from loragate.registry.settings import VLLM_LORA_RANKS


class ResidencyMixin(RegistryBase):
    def residency_plan(self, base_model_id: str, *, role: str = "production", memory: bool = True) -> ResidencyPlan:
        """What replicas of ``base_model_id`` in ``role`` must hold. ``memory``: size each
        version too (reads the base's ``config.json``; the counts and ranks need no file).
        When the base's files cannot be read the plan says so and leaves memory unknown.
        Its ``pinned`` count is the pinned adapters (``adapter_pins``) production serves: the
        production replicas keep them in slots; a canary replica pins none.

        Raises:
            InvalidInput: UNKNOWN_BASE for a base that is not pinned; INVALID_SETTING for a
                bad role; MANIFEST_MISMATCH naming a target module whose memory cannot be
                planned; INVALID_BASE naming a config.json key it lacks.
            IntegrityFailure: BASE_DRIFT when the base's config.json changed since it was pinned.
        """
        pins = self._store.catalog.bases(base_model_id)
        if not pins:
            raise InvalidInput(f"base {base_model_id} is not pinned", code=ErrorCode.UNKNOWN_BASE, field="base")
        replica_role = replica_role_of(role)
        windows = {w.adapter_name: w.version_id for w in self._store.canary.windows(statuses=ACTIVE)}
        adapters = self._store.pointers.all_pointers(base_model_id)
        shapes: dict[str, tuple[BaseShape | None, str]] = {}

        def shape_of(commit: str) -> tuple[BaseShape | None, str]:
            if commit not in shapes:
                record = next((b for b in pins if b.base_model_commit == commit), None)
                shapes[commit] = self._base_shape(record) if record else (None, f"base commit {commit} is not pinned")
            return shapes[commit]

        residents = []
        for name, version_id, residence in resident_set(replica_role, adapters, windows):
            version = self._store.versions.get(version_id)
            targets = version.manifest["target_modules"]
            target_modules = targets if isinstance(targets, str) else tuple(targets)
            size = None
            if memory:
                shape = shape_of(version.base_model_commit)[0]
                size = adapter_bytes(shape, version.lora_rank, target_modules) if shape else None
            residents.append(ResidentVersion(name, version_id, residence, version.lora_rank, target_modules, size))
        pinned = 0
        if replica_role == ReplicaRole.PRODUCTION:
            names = {p.name for p in self._store.pins.pins()}
            pinned = sum(1 for r in residents if r.residence == Residence.SERVED and r.name in names)
        # slots are sized by the latest pin's shape: the commit replicas are added at by default
        shape, note = shape_of(pins[-1].base_model_commit) if memory else (None, "")
        return ResidencyPlan(
            base_model_id,
            replica_role,
            tuple(residents),
            pinned=pinned,
            shape=shape,
            shape_note=note or next((n for _, n in shapes.values() if n), ""),
            accepted_ranks=VLLM_LORA_RANKS,
        )

    def _base_shape(self, record: BaseModelRecord) -> tuple[BaseShape | None, str]:
        """The base's shape from its ``config.json``, or (None, why) when its files are not
        on this machine (a hub base outside this host's cache).

        Raises:
            IntegrityFailure: BASE_DRIFT, the file no longer hashes to the pinned config.
            InvalidInput: INVALID_BASE naming a key the shape needs that the file lacks.
        """
        try:
            raw = (base_directory(record, self.settings.hf_cache_dir) / "config.json").read_bytes()
        except (InvalidInput, OSError) as e:
            return None, f"config.json of {record.label} is not readable here ({type(e).__name__}): memory unknown"
        if config_facts(raw)["config_sha256"] != record.config_sha256:
            raise IntegrityFailure(
                f"base {record.label} config.json changed since it was pinned: its memory cannot be planned",
                code=ErrorCode.BASE_DRIFT,
                field="base_config_sha256",
            )
        config = loads_object(raw, what="config.json", code=ErrorCode.INVALID_BASE, field="config.json")
        return BaseShape.from_config(config), ""
