"""The registry's operations: register, resolve, promote, roll back, materialize.

``Registry`` ties the SQL store, the artifact store and the settings together. Every
check on an incoming bundle runs before anything is written, so a rejected register
leaves no row and no blob; only then are blobs stored (content-addressed, so a repeat
uploads nothing) and the version row inserted in one transaction.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

from registry.artifacts import ArtifactStore, open_artifact_store
from registry.bundle import (
    ADAPTER_CONFIG_FILE,
    BUNDLE_FILES,
    MANIFEST_FILE,
    WEIGHTS_FILE,
    BundleSnapshot,
    check_adapter_config,
    check_weights_against,
    parse_adapter_config,
    snapshot_bundle,
    write_atomic_dir,
)
from registry.catalog import BaseModelRecord, inspect_base
from registry.digests import digest_of_hex, sha256_bytes, sha256_file
from registry.domain import AdapterVersion, GoldenSetRef, ValidationRun
from registry.errors import AlreadyExists, ConcurrentUpdate, ErrorCode, IntegrityFailure, InvalidInput, NotFound
from registry.golden import GoldenSet, parse_golden_set
from registry.lifecycle import Plan, Pointer, plan_promotion, plan_rollback, plan_validation_result
from registry.manifest import Manifest, content_address, parse_json_object, parse_manifest
from registry.names import AdapterName
from registry.settings import Settings
from registry.store import SqlStore, utcnow
from registry.weights import inspect_lora_weights

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


@dataclass(frozen=True)
class RegisterResult:
    version: AdapterVersion
    created: bool
    uploaded_blobs: int


class Registry:
    def __init__(self, store: SqlStore, artifacts: ArtifactStore, settings: Settings):
        self.store = store
        self.artifacts = artifacts
        self.settings = settings

    @classmethod
    def open(cls, settings: Settings, *, check_schema: bool = True) -> "Registry":
        if settings.database_url.startswith("sqlite:///"):
            Path(settings.database_url[len("sqlite:///"):]).parent.mkdir(parents=True, exist_ok=True)
        registry = cls(SqlStore.from_url(settings.database_url), open_artifact_store(settings.artifacts, settings.s3_endpoint_url), settings)
        if check_schema:
            registry.store.check_schema()
        return registry

    def init(self) -> None:
        self.store.upgrade_schema()
        self.artifacts.ensure()

    # -- base catalog ---------------------------------------------------------

    def add_base(self, source: str, base_model_id: str, revision: str | None = None) -> tuple[BaseModelRecord, bool]:
        return self.store.add_base(inspect_base(source, base_model_id, revision, self.settings.hf_cache_dir), self.settings.actor)

    def _bind_base(self, manifest: Manifest) -> BaseModelRecord:
        candidates = self.store.bases(manifest.base_model_id)
        if not candidates:
            raise InvalidInput(f"base model {manifest.base_model_id!r} is not in the catalog (loragate base add)", code=ErrorCode.UNKNOWN_BASE, field="base_model_id")
        if manifest.base_model_commit is None:
            if len(candidates) > 1:
                raise InvalidInput(
                    f"base {manifest.base_model_id!r} is pinned at {len(candidates)} commits; the manifest must name base_model_commit",
                    code=ErrorCode.INVALID_MANIFEST,
                    field="base_model_commit",
                )
            return candidates[0]
        for base in candidates:
            if base.base_model_commit == manifest.base_model_commit:
                return base
        raise InvalidInput(
            f"base {manifest.base_model_id!r} has no pinned commit {manifest.base_model_commit!r}",
            code=ErrorCode.UNKNOWN_BASE,
            field="base_model_commit",
        )

    # -- register -------------------------------------------------------------

    def register_adapter(self, bundle_dir: Path, name: str, progress: Progress = _quiet) -> RegisterResult:
        adapter_name = AdapterName.parse(name)
        progress(f"reading and hashing {bundle_dir}")
        with snapshot_bundle(Path(bundle_dir), max_weights_bytes=self.settings.max_weights_bytes, max_json_bytes=self.settings.max_json_bytes) as snap:
            progress(f"weights sha256 {snap.weights_sha256[:12]} ({snap.weights_size} bytes); checking")
            manifest, base = self._checked_manifest(snap, adapter_name)
            identity = manifest.identity_sha256()
            address = content_address(identity, snap.weights_sha256, snap.adapter_config_sha256)
            existing = self.store.find_version_by_content(str(adapter_name), address)
            if existing is not None:
                progress(f"already registered as {existing.version_id}")
                return RegisterResult(existing, created=False, uploaded_blobs=0)
            if manifest.adapter_version is not None:
                raise InvalidInput(
                    f"adapter_version {manifest.adapter_version!r} is assigned by the registry; no such version has this content",
                    code=ErrorCode.INVALID_MANIFEST,
                    field="adapter_version",
                )
            return self._store_new_version(adapter_name, manifest, base, snap, identity, address, progress)

    def _checked_manifest(self, snap: BundleSnapshot, name: AdapterName) -> tuple[Manifest, BaseModelRecord]:
        data = parse_json_object(snap.manifest_raw, what=MANIFEST_FILE, code=ErrorCode.INVALID_MANIFEST, field=MANIFEST_FILE)
        manifest = parse_manifest(data)
        if manifest.base_model_id != name.base:
            raise InvalidInput(
                f"manifest base_model_id {manifest.base_model_id!r} differs from the base segment of {str(name)!r}",
                code=ErrorCode.MANIFEST_MISMATCH,
                field="base_model_id",
            )
        owned = [f for f in manifest.lifecycle_fields_set() if f not in ("adapter_version", "previous_version")]
        if owned:
            raise InvalidInput(f"manifest field {owned[0]!r} is owned by the registry's lifecycle; leave it out", code=ErrorCode.INVALID_MANIFEST, field=owned[0])
        if manifest.weights_sha256 is not None and manifest.weights_sha256 != snap.weights_sha256:
            raise InvalidInput(
                f"manifest claims weights_sha256 {manifest.weights_sha256[:12]}..., the file hashes to {snap.weights_sha256[:12]}...",
                code=ErrorCode.DIGEST_MISMATCH,
                field="weights_sha256",
            )
        base = self._bind_base(manifest)
        for field, pinned in (
            ("base_config_sha256", base.config_sha256),
            ("tokenizer_revision", base.tokenizer_revision),
            ("rope_scaling", base.rope_scaling),
        ):
            if field in manifest.model_fields_set and getattr(manifest, field) != pinned:
                raise InvalidInput(
                    f"manifest {field} {getattr(manifest, field)!r} differs from pinned base {base.label}: {pinned!r}",
                    code=ErrorCode.BASE_MISMATCH,
                    field=field,
                )
        adapter_config = parse_adapter_config(snap.adapter_config_raw)
        fills: dict[str, Any] = {
            "weights_sha256": snap.weights_sha256,
            "base_model_commit": base.base_model_commit,
            "base_config_sha256": base.config_sha256,
            "tokenizer_revision": base.tokenizer_revision,
            "rope_scaling": base.rope_scaling,
        }
        if "lora_dropout" not in manifest.model_fields_set:
            fills["lora_dropout"] = adapter_config.get("lora_dropout", 0.0)
        manifest = parse_manifest({**data, **fills})
        check_adapter_config(adapter_config, manifest, base.binding_names())
        weights = inspect_lora_weights(snap.weights_path)
        check_weights_against(
            weights, manifest, max_lora_rank=self.settings.max_lora_rank, base_shapes=base.module_shapes, base_label=base.label
        )
        return manifest, base

    def _store_new_version(self, name: AdapterName, manifest: Manifest, base: BaseModelRecord, snap: BundleSnapshot,
                           identity: str, address: str, progress: Progress) -> RegisterResult:
        for _ in range(8):
            created_at = utcnow()
            version_id = self._free_version_id(created_at, snap.weights_sha256)
            previous = self.store.latest_version_id(str(name))
            final = manifest.model_copy(update={"adapter_version": version_id, "previous_version": previous, "validation_status": "pending"})
            manifest_bytes = final.canonical_bytes()
            manifest_hex = sha256_bytes(manifest_bytes)
            progress(f"storing blobs in {self.artifacts.location}")
            uploaded = 0
            uploaded += self.artifacts.put_file(digest_of_hex(snap.weights_sha256), snap.weights_path)
            uploaded += self.artifacts.put_bytes(digest_of_hex(snap.adapter_config_sha256), snap.adapter_config_raw)
            uploaded += self.artifacts.put_bytes(digest_of_hex(manifest_hex), manifest_bytes)
            values = {
                "version_id": version_id,
                "content_address": address,
                "identity_sha256": identity,
                "manifest_sha256": manifest_hex,
                "weights_sha256": snap.weights_sha256,
                "weights_size": snap.weights_size,
                "adapter_config_sha256": snap.adapter_config_sha256,
                "base_model_id": base.base_model_id,
                "base_model_commit": base.base_model_commit,
                "lora_rank": manifest.lora_rank,
                "stage": "staging",
                "validation_status": "pending",
                "manifest": final.model_dump(mode="json"),
            }
            try:
                version = self.store.insert_version(name, values, expected_previous=previous, created_at=created_at, actor=self.settings.actor)
            except ConcurrentUpdate:
                raced = self.store.find_version_by_content(str(name), address)
                if raced is not None:
                    return RegisterResult(raced, created=False, uploaded_blobs=uploaded)
                continue
            progress(f"registered {version.version_id}")
            return RegisterResult(version, created=True, uploaded_blobs=uploaded)
        raise ConcurrentUpdate(f"could not register a version of {name}: too many concurrent registrations")

    def _free_version_id(self, created_at, weights_hex: str) -> str:
        # ids carry the second they were made; two different manifests over the same
        # weights in one second take the next free second instead of colliding
        for offset in range(3600):
            candidate = f"{created_at + timedelta(seconds=offset):%Y%m%d_%H%M%S}_{weights_hex[:12]}"
            if not self.store.version_id_taken(candidate):
                return candidate
        raise ConcurrentUpdate("no free version id within an hour of now")

    # -- reading --------------------------------------------------------------

    def get_version(self, version_id: str) -> AdapterVersion:
        return self.store.get_version(version_id)

    def resolve_stage(self, name: str, stage: str = "production") -> str:
        AdapterName.parse(name)
        try:
            pointer = Pointer(stage)
        except ValueError:
            raise InvalidInput(f"stage {stage!r} is not one of {[p.value for p in Pointer]}", code=ErrorCode.INVALID_MANIFEST, field="stage")
        version_id = self.store.resolve(name, pointer.value)
        if version_id is None:
            self.store.get_adapter(name)  # NotFound when the adapter itself is unknown
            raise NotFound(f"{name} has no {stage} version", field="stage")
        return version_id

    def describe_version(self, version_id: str) -> dict[str, Any]:
        version = self.store.get_version(version_id)
        runs = self.store.validation_runs(version_id)
        adapter = self.store.get_adapter(version.name)
        pointers = [p for p, v in (("canary", adapter.canary), ("production", adapter.production), ("previous", adapter.previous)) if v == version_id]
        deployed_at = self.store.deployed_at(version.name, "production") if "production" in pointers else None
        report = runs[-1].report if runs else None
        return {
            **version.as_dict(),
            "pointers": pointers,
            "manifest": version.manifest_view(report, deployed_at),
            "validation_runs": [{k: r.as_dict()[k] for k in ("id", "status", "golden_set_digest", "output_sha256", "finished_at")} for r in runs],
        }

    # -- lifecycle ------------------------------------------------------------

    def promote(self, version_id: str, to: str, reason: str | None = None) -> Plan:
        try:
            target = Pointer(to)
        except ValueError:
            raise InvalidInput(f"--to must be canary or production, not {to!r}", code=ErrorCode.ILLEGAL_TRANSITION, field="to")
        return self.store.apply_plan(
            lambda pointers, states: plan_promotion(pointers, states[version_id], target, states),
            subject=version_id,
            actor=self.settings.actor,
            reason=reason,
        )

    def rollback(self, name: str, stage: str = "production", reason: str | None = None) -> Plan:
        AdapterName.parse(name)
        try:
            target = Pointer(stage)
        except ValueError:
            raise InvalidInput(f"--stage must be canary or production, not {stage!r}", code=ErrorCode.ILLEGAL_TRANSITION, field="stage")
        return self.store.apply_plan(
            lambda pointers, states: plan_rollback(pointers, target, states, name),
            name=name,
            actor=self.settings.actor,
            reason=reason,
        )

    # -- bundles --------------------------------------------------------------

    def materialize(self, version_id: str, dest: Path) -> Path:
        """Write the version's bundle to ``dest`` atomically, for a replica to load.

        An existing ``dest`` holding exactly this bundle is left alone: a replica may be
        reading it, and vLLM re-reads evicted adapters from their path.
        """
        version = self.store.get_version(version_id)
        expected = {
            WEIGHTS_FILE: version.weights_sha256,
            ADAPTER_CONFIG_FILE: version.adapter_config_sha256,
            MANIFEST_FILE: version.manifest_sha256,
        }
        dest = Path(dest)
        if dest.exists():
            if all((dest / f).is_file() and sha256_file(dest / f) == h for f, h in expected.items()):
                return dest
            raise AlreadyExists(f"{dest} exists and does not hold version {version_id}", field="dest")
        dest.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".fetch-", dir=dest.parent) as tmp:
            files = {}
            for name in BUNDLE_FILES:
                path = Path(tmp) / name
                self.artifacts.fetch_to(digest_of_hex(expected[name]), path)
                files[name] = path
            write_atomic_dir(dest, files)
        return dest

    # -- golden sets ----------------------------------------------------------

    def attach_golden_set(self, name: str, path: Path) -> GoldenSetRef:
        AdapterName.parse(name)
        self.store.get_adapter(name)
        raw = _read_limited(Path(path), self.settings.max_json_bytes, "golden_set")
        golden = parse_golden_set(raw, min_cases=self.settings.golden_min_cases)
        self.artifacts.put_bytes(golden.digest, golden.canonical_bytes())
        return self.store.attach_golden_set(name, golden.digest, len(golden.cases), self.settings.actor)

    def golden_set(self, name: str) -> tuple[GoldenSetRef, GoldenSet]:
        ref = self.store.current_golden_set(name)
        if ref is None:
            self.store.get_adapter(name)
            raise NotFound(f"{name} has no golden set attached (loragate golden set {name} FILE)", field="golden_set")
        raw = self.artifacts.read_bytes(ref.digest)
        golden = parse_golden_set(raw, min_cases=1)
        if golden.digest != ref.digest:
            raise IntegrityFailure(f"golden set {ref.digest} re-parses to {golden.digest}", field="golden_set")
        return ref, golden

    def record_validation(self, version: AdapterVersion, run: dict[str, Any]) -> ValidationRun:
        passed = run["status"] == "passed"

        def planner(state):
            plan = plan_validation_result(state, passed)
            plan.audit_from, plan.audit_to = state.validation_status, run["status"]
            return plan

        return self.store.record_validation(version, planner, run, self.settings.actor)


def _read_limited(path: Path, limit: int, field: str) -> bytes:
    if not path.is_file():
        raise InvalidInput(f"{path} is not a file", code=ErrorCode.INVALID_BUNDLE, field=field)
    size = path.stat().st_size
    if size > limit:
        raise InvalidInput(f"{path} is {size} bytes, over the {limit}-byte limit", code=ErrorCode.TOO_LARGE, field=field)
    return path.read_bytes()
