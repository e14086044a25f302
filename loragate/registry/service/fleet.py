"""The serving fleet as the registry sees it: the replicas of each pinned base, every
adapter's pointers, what a replica serving a version must answer, and the version's bundle
written where a replica loads it from. A replica whose slots or rank limit cannot hold what
its role keeps (``service/residency.py``) is not added. Switching replicas is
``tasks/fleet.py``'s work."""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from loragate.registry.digests import digest_of_hex, sha256_file
from loragate.registry.errors import AlreadyExists, ErrorCode, InvalidInput, NotFound
from loragate.registry.intake.bundle import publish_dir
from loragate.registry.intake.golden import GoldenSet, load_stored_golden_set
from loragate.registry.rules.access import Action
from loragate.registry.rules.fleet import AdapterPointers, Replica
from loragate.registry.rules.fleet import replica_role as replica_role_of
from loragate.registry.rules.lifecycle import Pointer, ValidationStatus
from loragate.registry.rules.names import AdapterName
from loragate.registry.service.residency import ResidencyMixin
from loragate.registry.settings import VLLM_LORA_RANKS
from loragate.registry.storage.bundle_files import ADAPTER_CONFIG_FILE, BUNDLE_FILES, MANIFEST_FILE, WEIGHTS_FILE
from loragate.registry.storage.scratch import scratch_dir, sweep

# a switch records what it did to the replicas under whichever of these moved the pointer
FLEET_MOVES = (
    Action.MANAGE_FLEET,
    Action.PROMOTE_CANARY,
    Action.PROMOTE_PRODUCTION,
    Action.ROLLBACK_PRODUCTION,
    Action.WITHDRAW_CANARY,
)


class FleetMixin(ResidencyMixin):
    def add_replica(
        self,
        url: str,
        base_model_id: str,
        role: str,
        adapter_dir: str,
        *,
        base_model_commit: str | None = None,
        max_lora_rank: int = 16,
        max_loras: int = 4,
        served_model_name: str | None = None,
    ) -> tuple[Replica, bool]:
        """Put a replica of a pinned base in the fleet; returns (replica, created).

        The commit may be left out when the base is pinned at exactly one: a replica is
        operator configuration, and what it serves is checked on every deploy.

        Raises:
            InvalidInput: INVALID_SETTING for a bad URL, role or limit, or ``max_loras`` below
                the pinned and warm adapters a replica of the role keeps in slots; RANK_LIMIT
                (field ``max_lora_rank``) below the rank of a version it would serve;
                UNKNOWN_BASE for a base or commit that is not pinned.
            AlreadyExists: the URL is in the fleet with another configuration.
            PermissionDenied: not the admin role (a replica's figures decide verdicts: which
                replicas there are is a person's act, migration 0016).
        """
        actor = self._authorize(Action.MANAGE_REPLICAS)
        try:
            parsed = urllib.parse.urlsplit(url)
            parsed.port  # noqa: B018 (raises on a port that is not a number)
        except ValueError:
            parsed = None
        if (
            parsed is None
            or parsed.scheme not in ("http", "https")
            or not parsed.hostname
            or parsed.path not in ("", "/")
            or parsed.query
            or parsed.fragment
            or parsed.username
        ):
            raise InvalidInput(
                f"replica URL {url!r} is not http(s)://host:port (the server's root, no credentials)",
                code=ErrorCode.INVALID_SETTING,
                field="url",
            )
        replica_role = replica_role_of(role)
        if max_lora_rank not in VLLM_LORA_RANKS:
            raise InvalidInput(
                f"max_lora_rank {max_lora_rank} is not one vLLM accepts: {VLLM_LORA_RANKS}",
                code=ErrorCode.INVALID_SETTING,
                field="max_lora_rank",
            )
        if max_loras < 1:
            raise InvalidInput(
                f"max_loras {max_loras} must be at least 1", code=ErrorCode.INVALID_SETTING, field="max_loras"
            )
        if not adapter_dir.strip() or "\x00" in adapter_dir:
            raise InvalidInput(
                "adapter_dir must name the directory the replica loads adapters from",
                code=ErrorCode.INVALID_SETTING,
                field="adapter_dir",
            )
        pins = self._store.catalog.bases(base_model_id)
        if base_model_commit is None and len(pins) == 1:
            base_model_commit = pins[0].base_model_commit
        if not any(b.base_model_commit == base_model_commit for b in pins):
            raise InvalidInput(
                f"base {base_model_id}@{base_model_commit} is not pinned"
                + (" (it is pinned at several commits: name one)" if len(pins) > 1 else ""),
                code=ErrorCode.UNKNOWN_BASE,
                field="base",
            )
        assert base_model_commit is not None
        plan = self.residency_plan(base_model_id, role=replica_role.value, memory=False)
        for shortfall in plan.refusals(max_loras, max_lora_rank):
            raise InvalidInput(
                f"{shortfall.message}; the replica was not added",
                code=ErrorCode.RANK_LIMIT if shortfall.field == "max_lora_rank" else ErrorCode.INVALID_SETTING,
                field=shortfall.field,
            )
        replica = Replica(
            url=url.rstrip("/"),
            base_model_id=base_model_id,
            base_model_commit=base_model_commit,
            role=replica_role,
            adapter_dir=str(Path(adapter_dir).absolute()),
            max_lora_rank=max_lora_rank,
            max_loras=max_loras,
            served_model_name=served_model_name or base_model_id,
        )
        return self._store.fleet.add(replica, actor)

    def remove_replica(self, url: str) -> Replica:
        """Raises:
        NotFound: no replica with that URL.
        PermissionDenied: not the admin role.
        """
        return self._store.fleet.remove(url.rstrip("/"), self._authorize(Action.MANAGE_REPLICAS))

    def list_replicas(self, base_model_id: str | None = None) -> list[Replica]:
        return self._store.fleet.replicas(base_model_id)

    def adapter_pointers(self, base_model_id: str | None = None) -> list[AdapterPointers]:
        return self._store.pointers.all_pointers(base_model_id)

    def record_fleet_actions(self, action: str, entries: list[dict[str, Any]], reason: str | None = None) -> None:
        """Audit what a switch or a reconcile did to the replicas."""
        actor = self._authorize_any(FLEET_MOVES)
        self._store.fleet.record_actions(actor, action, entries, reason)

    def expected_outputs(self, version_id: str) -> tuple[GoldenSet, dict[str, str]] | None:
        """The golden set and greedy outputs of the version's latest passed validation: what
        a replica serving it must answer. None when it never passed.

        Raises:
            IntegrityFailure: the stored golden set no longer matches its digest.
        """
        passed = [r for r in self._store.validation.runs(version_id) if r.status == ValidationStatus.PASSED]
        if not passed or passed[-1].golden_set_digest is None or not passed[-1].report.outputs:
            return None
        run = passed[-1]
        assert run.golden_set_digest is not None and run.report.outputs is not None
        golden = load_stored_golden_set(self._artifacts.read_bytes(run.golden_set_digest), run.golden_set_digest)
        return golden, run.report.outputs

    def bundle_digests(self, version_id: str) -> dict[str, str]:
        """The hex SHA-256 each file of the version's bundle must have, wherever it is copied.

        Raises:
            NotFound: no such version.
        """
        version = self._store.versions.get(version_id)
        return {
            WEIGHTS_FILE: version.weights_sha256,
            ADAPTER_CONFIG_FILE: version.adapter_config_sha256,
            MANIFEST_FILE: version.manifest_sha256,
        }

    def materialize(self, version_id: str, dest: Path) -> Path:
        """Write the version's bundle to ``dest`` atomically, for a replica to load.

        An existing ``dest`` holding exactly this bundle is left alone: a replica may be
        reading it, and vLLM re-reads evicted adapters from their path.

        Raises:
            NotFound: no such version.
            AlreadyExists: ``dest`` exists with other content.
            IntegrityFailure: a stored blob is missing or corrupted.
        """
        expected = self.bundle_digests(version_id)
        dest = Path(dest)
        if dest.exists():
            if all((dest / f).is_file() and sha256_file(dest / f) == h for f, h in expected.items()):
                return dest
            raise AlreadyExists(f"{dest} exists and does not hold version {version_id}", field="dest")
        dest.parent.mkdir(parents=True, exist_ok=True)
        sweep(dest.parent, self.settings.litter_age_s)  # fetches of crashed materializes
        with scratch_dir("fetch", dest.parent, hidden=True) as staging:
            for name in BUNDLE_FILES:
                self._artifacts.fetch_to(digest_of_hex(expected[name]), staging / name)
            publish_dir(staging, dest)
        return dest

    def verify_blobs(self, version_id: str) -> None:
        """Check that the version's three blobs are stored and match their digests.

        Raises:
            NotFound: no such version.
            IntegrityFailure: ARTIFACT_CORRUPTED naming the blob.
        """
        version = self._store.versions.get(version_id)
        for hexdigest in version.blob_digests:
            self._artifacts.verify(digest_of_hex(hexdigest))

    @contextmanager
    def holding_adapter(self, name: str) -> Iterator[AdapterPointers | None]:
        """Hold the adapter's row -- the lock a pointer move keeps until it commits, switch
        included -- for a block that acts on replicas for this adapter, with its pointers as
        they are under that lock. A reconcile inside it cannot undo a switch in flight, and
        acts on what the move committed. None (and no lock) for a name the registry does not
        know: no move of it can be in flight. Nothing is written.

        Raises:
            PermissionDenied: the caller may not act on the fleet.
        """
        self._authorize_any(FLEET_MOVES, name)
        try:
            base = AdapterName.parse(name).base
        except InvalidInput:
            yield None
            return
        entered = False
        try:
            with self._store.pointers.claim(name=name) as claim:
                entered = True
                yield AdapterPointers(
                    name,
                    base,
                    claim.pointers.get(Pointer.CANARY),
                    claim.pointers.get(Pointer.PRODUCTION),
                    claim.pointers.get(Pointer.PREVIOUS),
                )
        except NotFound:
            if entered:
                raise
            yield None
