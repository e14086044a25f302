"""The registry's operations: register, resolve, promote, roll back, materialize, validate.

``Registry`` is the only API the layers above ``registry/`` use: it ties the SQL store,
the artifact store and the settings together, and neither store is reachable from
outside. Every check on an incoming bundle runs before anything is written, so a
rejected register leaves no row and no blob; only then are blobs stored
(content-addressed, so a repeat uploads nothing) and the version row inserted in one
transaction.
"""

from __future__ import annotations

import shutil
import tempfile
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

from registry.db.store import SqlStore
from registry.errors import (
    AlreadyExists,
    ErrorCode,
    IllegalTransition,
    InvalidInput,
    NotFound,
    PermissionDenied,
    SignatureInvalid,
)
from registry.intake.binding import binding_mismatches
from registry.intake.bundle import (
    ADAPTER_CONFIG_FILE,
    BUNDLE_FILES,
    MANIFEST_FILE,
    WEIGHTS_FILE,
    BundleSnapshot,
    check_adapter_config,
    check_weights_against,
    parse_adapter_config,
    publish_dir,
    read_regular_file,
    snapshot_bundle,
)
from registry.intake.catalog import BaseModelRecord, inspect_base
from registry.intake.digests import canonical_json, digest_of_hex, sha256_bytes, sha256_file
from registry.intake.golden import GoldenSet, digest_if_parseable, load_stored_golden_set, parse_golden_set
from registry.intake.manifest import Manifest, content_address, parse_json_object, parse_manifest
from registry.intake.weights import inspect_lora_weights
from registry.records.adapters import Adapter, AdapterVersion, AuditEvent, GoldenSetRef, ValidationRun, utcnow
from registry.records.reports import ValidationReport, WeightScan
from registry.rules.access import (
    Action,
    IssuedToken,
    Principal,
    Role,
    SigningKey,
    TokenRecord,
    VersionSignature,
    check_namespace,
    issue_token,
    parse_role,
    secret_matches,
    split_token,
)
from registry.rules.canary import ACTIVE, CanaryThresholds, CanaryWindow, Observation, WindowStatus
from registry.rules.fleet import AdapterPointers, Replica, ReplicaRole
from registry.rules.lifecycle import (
    Plan,
    Pointer,
    Stage,
    ValidationStatus,
    plan_promotion,
    plan_rollback,
    plan_validation_result,
)
from registry.rules.names import AdapterName
from registry.settings import VLLM_LORA_RANKS, Settings
from registry.storage.artifacts import ArtifactStore, StoredBlob, fetch_s3_bundle, open_artifact_store
from registry.storage.scratch import Litter, find_litter, remove, scratch_dir, sweep
from registry.storage.signing import (
    SIGNED_REPORT_FILE,
    key_id,
    public_key_of,
    sign_directory,
    signed_digests,
    verify_directory,
    write_signed_report,
)

Progress = Callable[[str], None]
# the audit log records "<holder> (<role> token <id>)" in 128 characters
MAX_HOLDER = 64
# a switch records what it did to the replicas under whichever of these moved the pointer
FLEET_MOVES = (
    Action.MANAGE_FLEET,
    Action.PROMOTE_CANARY,
    Action.PROMOTE_PRODUCTION,
    Action.ROLLBACK_PRODUCTION,
    Action.WITHDRAW_CANARY,
)


def _quiet(_: str) -> None:
    pass


def _bundle_digests(version: AdapterVersion) -> tuple[str, str, str]:
    """The version's digests in ``BUNDLE_FILES`` order."""
    by_file = {
        WEIGHTS_FILE: version.weights_sha256,
        ADAPTER_CONFIG_FILE: version.adapter_config_sha256,
        MANIFEST_FILE: version.manifest_sha256,
    }
    return tuple(by_file[f] for f in BUNDLE_FILES)  # type: ignore[return-value]


def signed_report(version: AdapterVersion, run: ValidationRun) -> dict[str, Any]:
    """What a signature says about validation: the run it passed, its golden set and
    outputs, and the full report."""
    return {
        "version_id": version.version_id,
        "validation_run_id": run.id,
        "status": run.status.value,
        "golden_set_digest": run.golden_set_digest,
        "output_sha256": run.output_sha256,
        "report": run.report.to_json(),
    }


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


@dataclass(frozen=True)
class RegisterResult:
    version: AdapterVersion
    created: bool
    uploaded_blobs: int


class Registry:
    """Reads are open to whoever reaches the database; every write is authorized first,
    for the ``principal`` given, or else for the token in ``settings.token`` (looked up
    on the first write, so read-only commands never need one)."""

    def __init__(
        self, store: SqlStore, artifacts: ArtifactStore, settings: Settings, principal: Principal | None = None
    ):
        self._store = store
        self._artifacts = artifacts
        self.settings = settings
        self._principal = principal

    @classmethod
    def open(cls, settings: Settings, *, check_schema: bool = True, principal: Principal | None = None) -> Registry:
        """Connect to the registry ``settings`` name, acting as ``principal`` (default: the
        holder of ``settings.token``).

        Raises:
            InvalidInput: NOT_INITIALIZED when ``check_schema`` and the schema is missing or
                outdated (``loragate init``); INVALID_SETTING for an unusable artifact location.
        """
        if settings.sqlite_path is not None:
            settings.sqlite_path.parent.mkdir(parents=True, exist_ok=True)
        registry = cls(
            SqlStore.from_url(settings.database, settings.database_connect_timeout_s),
            open_artifact_store(settings),
            settings,
            principal,
        )
        if check_schema:
            registry._store.check_schema()
        return registry

    def close(self) -> None:
        self._store.close()

    def __enter__(self) -> Registry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def init(self) -> IssuedToken | None:
        """Create or upgrade the schema (Alembic) and the artifact store; returns the first
        admin token when the registry has no active one yet (shown once, stored hashed).

        Whoever can run migrations owns the database already, so this needs no token.
        """
        self._store.upgrade_schema()
        self._artifacts.ensure()
        if any(t.role == Role.ADMIN and t.active for t in self._store.tokens()):
            return None
        issued = issue_token()
        self._store.create_token(issued, Role.ADMIN, None, "admin", f"{self.settings.actor} (loragate init)")
        return issued

    # -- who is calling ---------------------------------------------------------

    @property
    def principal(self) -> Principal:
        """Raises:
        PermissionDenied: no token, or one that is malformed, unknown or revoked.
        """
        if self._principal is None:
            self._principal = self.authenticate(self.settings.token)
        return self._principal

    def authenticate(self, token: str | None) -> Principal:
        """Raises:
        PermissionDenied: no token, or one that is malformed, unknown or revoked (the
            message never repeats the token).
        """
        if not token:
            raise PermissionDenied("this needs a token: set LORAGATE_TOKEN or pass --token", field="LORAGATE_TOKEN")
        token_id, secret_hash = split_token(token)
        found = self._store.token(token_id)
        if found is None or not secret_matches(secret_hash, found[1]):
            raise PermissionDenied(f"token {token_id} is not known to this registry", field="LORAGATE_TOKEN")
        record = found[0]
        if not record.active:
            raise PermissionDenied(f"token {token_id} was revoked", field="LORAGATE_TOKEN")
        return Principal.of_token(record)

    def _authorize(self, action: Action, name: str | None = None) -> str:
        """The actor to record, once the principal may do ``action`` on ``name``.

        Raises:
            PermissionDenied: nothing was changed.
        """
        principal = self.principal
        principal.require(action, name)
        return principal.actor

    def _authorize_any(self, actions: tuple[Action, ...], name: str | None = None) -> str:
        principal = self.principal
        if not any(principal.may(action, name) for action in actions):
            principal.require(actions[0], name)  # raises, naming the first
        return principal.actor

    @property
    def artifacts_location(self) -> str:
        return self._artifacts.location

    # -- base catalog ---------------------------------------------------------

    def add_base(self, source: str, base_model_id: str, revision: str | None = None) -> tuple[BaseModelRecord, bool]:
        """Pin a base model; returns (record, created).

        Raises:
            InvalidInput: INVALID_BASE / INVALID_NAME for a source, id or revision that
                cannot be pinned; AlreadyExists for the same pin with other content.
        """
        actor = self._authorize(Action.MANAGE_BASES)
        record = inspect_base(source, base_model_id, revision, self.settings.hf_cache_dir)
        return self._store.add_base(record, actor)

    def list_bases(self, base_model_id: str | None = None) -> list[BaseModelRecord]:
        return self._store.bases(base_model_id)

    def get_base(self, base_model_id: str, commit: str) -> BaseModelRecord:
        """Raises:
        NotFound: no such pin in the catalog.
        """
        base = self._store.get_base(base_model_id, commit)
        if base is None:
            raise NotFound(f"base {base_model_id}@{commit} is not in the catalog", field="base_model_commit")
        return base

    def _bind_base(self, manifest: Manifest) -> BaseModelRecord:
        base = self._store.get_base(manifest.base_model_id, manifest.base_model_commit)
        if base is not None:
            return base
        pinned = [b.base_model_commit for b in self._store.bases(manifest.base_model_id)]
        if not pinned:
            raise InvalidInput(
                f"base model {manifest.base_model_id!r} is not in the catalog (loragate base add)",
                code=ErrorCode.UNKNOWN_BASE,
                field="base_model_id",
            )
        raise InvalidInput(
            f"base {manifest.base_model_id!r} has no pinned commit {manifest.base_model_commit!r} "
            f"(pinned: {', '.join(pinned)})",
            code=ErrorCode.UNKNOWN_BASE,
            field="base_model_commit",
        )

    # -- register -------------------------------------------------------------

    def register_adapter(self, bundle_dir: Path, name: str, progress: Progress = _quiet) -> RegisterResult:
        """Register a bundle as a new version of ``name``; the same bytes again return the
        same version and write nothing.

        Raises:
            InvalidInput: the bundle, its manifest, its weights or the name is refused;
                the code and field say which check failed. Nothing was written.
            ConcurrentUpdate: the version row could not be inserted after retries.
        """
        adapter_name = AdapterName.parse(name)
        actor = self._authorize(Action.REGISTER, str(adapter_name))
        progress(f"reading and hashing {bundle_dir}")
        sweep(Path(tempfile.gettempdir()), self.settings.litter_age_s)  # snapshots of crashed registers
        with snapshot_bundle(
            Path(bundle_dir),
            max_weights_bytes=self.settings.max_weights_bytes,
            max_json_bytes=self.settings.max_json_bytes,
        ) as snap:
            progress(f"weights sha256 {snap.weights_sha256[:12]} ({snap.weights_size} bytes); checking")
            manifest, base = self._checked_manifest(snap, adapter_name)
            identity = manifest.identity_sha256()
            address = content_address(identity, snap.weights_sha256, snap.adapter_config_sha256)
            existing = self._store.find_version_by_content(str(adapter_name), address)
            if existing is not None:
                progress(f"already registered as {existing.version_id}")
                # the bytes are in hand: a blob lost or damaged since is written again
                return RegisterResult(existing, created=False, uploaded_blobs=self._store_blobs(existing, snap))
            if manifest.adapter_version is not None:
                raise InvalidInput(
                    f"adapter_version {manifest.adapter_version!r} is assigned by the registry; "
                    "no such version has this content",
                    code=ErrorCode.INVALID_MANIFEST,
                    field="adapter_version",
                )
            return self._store_new_version(adapter_name, manifest, base, snap, address, progress, actor)

    def register_from(self, location: str, name: str, progress: Progress = _quiet) -> RegisterResult:
        """Register the bundle at ``location``: a directory, or ``s3://bucket/prefix`` holding
        its three files (downloaded to scratch first, then checked like any bundle).

        Raises:
            InvalidInput: as ``register_adapter``; INVALID_BUNDLE for an S3 prefix missing a file.
            Unavailable: S3 cannot be reached.
        """
        if not location.startswith("s3://"):
            return self.register_adapter(Path(location), name, progress)
        self._authorize(Action.REGISTER, str(AdapterName.parse(name)))  # before any download
        progress(f"downloading {location}")
        with scratch_dir("bundle", Path(tempfile.gettempdir())) as scratch:
            fetch_s3_bundle(self.settings, location, BUNDLE_FILES, scratch)
            return self.register_adapter(scratch, name, progress)

    def _checked_manifest(self, snap: BundleSnapshot, name: AdapterName) -> tuple[Manifest, BaseModelRecord]:
        data = parse_json_object(
            snap.manifest_raw, what=MANIFEST_FILE, code=ErrorCode.INVALID_MANIFEST, field=MANIFEST_FILE
        )
        manifest = parse_manifest(data)
        if manifest.base_model_id != name.base:
            raise InvalidInput(
                f"manifest base_model_id {manifest.base_model_id!r} differs from the base segment of {str(name)!r}",
                code=ErrorCode.MANIFEST_MISMATCH,
                field="base_model_id",
            )
        owned = [f for f in manifest.lifecycle_fields_set() if f not in ("adapter_version", "previous_version")]
        if owned:
            raise InvalidInput(
                f"manifest field {owned[0]!r} is owned by the registry's lifecycle; leave it out",
                code=ErrorCode.INVALID_MANIFEST,
                field=owned[0],
            )
        if manifest.weights_sha256 is not None and manifest.weights_sha256 != snap.weights_sha256:
            raise InvalidInput(
                f"manifest claims weights_sha256 {manifest.weights_sha256[:12]}..., "
                f"the file hashes to {snap.weights_sha256[:12]}...",
                code=ErrorCode.DIGEST_MISMATCH,
                field="weights_sha256",
            )
        base = self._bind_base(manifest)
        stated = {f: getattr(manifest, f) for f in manifest.model_fields_set}
        mismatches = binding_mismatches(stated, base)
        if mismatches:
            raise InvalidInput(
                f"manifest {mismatches[0].describe(base)}",
                code=ErrorCode.BASE_MISMATCH,
                field=mismatches[0].field,
            )
        adapter_config = parse_adapter_config(snap.adapter_config_raw)
        # facts of the pinned base the manifest left out; the commit pins them
        fills: dict[str, Any] = {
            "weights_sha256": snap.weights_sha256,
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
            weights,
            manifest,
            max_lora_rank=self.settings.max_lora_rank,
            base_shapes=base.module_shapes,
            base_label=base.label,
        )
        return manifest, base

    def _store_new_version(
        self,
        name: AdapterName,
        manifest: Manifest,
        base: BaseModelRecord,
        snap: BundleSnapshot,
        address: str,
        progress: Progress,
        actor: str,
    ) -> RegisterResult:
        progress(f"storing blobs in {self._artifacts.location}")
        # a blob already there is verified first and rewritten when damaged or gone
        uploaded = int(self._artifacts.put_file(digest_of_hex(snap.weights_sha256), snap.weights_path))
        uploaded += self._artifacts.put_bytes(digest_of_hex(snap.adapter_config_sha256), snap.adapter_config_raw)

        def finalize(previous: str | None, version_id: str, created_at: datetime) -> dict[str, Any]:
            # runs under the adapter's row lock: previous_version is the newest version now
            nonlocal uploaded
            final = manifest.model_copy(
                update={
                    "adapter_version": version_id,
                    "previous_version": previous,
                    "validation_status": ValidationStatus.PENDING,
                }
            )
            manifest_bytes = final.canonical_bytes()
            manifest_hex = sha256_bytes(manifest_bytes)
            uploaded += self._artifacts.put_bytes(digest_of_hex(manifest_hex), manifest_bytes)
            return {
                "content_address": address,
                "identity_sha256": manifest.identity_sha256(),
                "manifest_sha256": manifest_hex,
                "weights_sha256": snap.weights_sha256,
                "weights_size": snap.weights_size,
                "adapter_config_sha256": snap.adapter_config_sha256,
                "base_model_id": base.base_model_id,
                "base_model_commit": base.base_model_commit,
                "lora_rank": manifest.lora_rank,
                "stage": Stage.STAGING.value,
                "validation_status": ValidationStatus.PENDING.value,
                "manifest": final.model_dump(mode="json"),
            }

        version, created = self._store.insert_version(name, address, snap.weights_sha256, finalize, actor=actor)
        # a gc that judged a reused blob an orphan just before the commit cannot win: the
        # version's blobs are checked once more, and written again from the bytes in hand
        uploaded += self._store_blobs(version, snap, verified=False)
        progress(f"registered {version.version_id}" if created else f"already registered as {version.version_id}")
        return RegisterResult(version, created=created, uploaded_blobs=uploaded)

    def _store_blobs(self, version: AdapterVersion, snap: BundleSnapshot, *, verified: bool = True) -> int:
        """Put the version's blobs the store lacks, from the bytes in hand; returns how many.

        ``verified`` judges a stored blob by its content (healing damage); otherwise only its
        presence is checked, for blobs this register has just verified or written.
        """
        store = self._artifacts
        present = store.holds if verified else store.exists
        puts: list[tuple[str, Callable[[], bool]]] = [
            (snap.weights_sha256, partial(store.put_file, digest_of_hex(snap.weights_sha256), snap.weights_path)),
            (
                snap.adapter_config_sha256,
                partial(store.put_bytes, digest_of_hex(snap.adapter_config_sha256), snap.adapter_config_raw),
            ),
            (version.manifest_sha256, partial(self._put_manifest, version)),
        ]
        return sum(put() for hexdigest, put in puts if not present(digest_of_hex(hexdigest)))

    def _put_manifest(self, version: AdapterVersion) -> bool:
        # the stored manifest is the canonical form of the row's: rebuilt, it must hash the same
        manifest_bytes = canonical_json(version.manifest)
        if sha256_bytes(manifest_bytes) != version.manifest_sha256:
            return False
        return self._artifacts.put_bytes(digest_of_hex(version.manifest_sha256), manifest_bytes)

    # -- reading --------------------------------------------------------------

    def get_version(self, version_id: str) -> AdapterVersion:
        """Raises:
        NotFound: no such version.
        """
        return self._store.get_version(version_id)

    def list_versions(self, name: str | None = None) -> list[AdapterVersion]:
        """Every version, or those of ``name``, oldest first.

        Raises:
            NotFound: ``name`` is given and no such adapter exists.
        """
        if name is not None:
            self._store.get_adapter(name)
        return self._store.list_versions(name)

    def get_adapter(self, name: str) -> Adapter:
        """The logical adapter and its pointers.

        Raises:
            NotFound: no such adapter.
        """
        return self._store.get_adapter(name)

    def history(self, name: str) -> list[AuditEvent]:
        """The audit log of a logical adapter, oldest first.

        Raises:
            NotFound: no such adapter.
        """
        return self._store.history(name)

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
        version_id = self._store.resolve(name, pointer.value)
        if version_id is None:
            self._store.get_adapter(name)  # NotFound when the adapter itself is unknown
            raise NotFound(f"{name} has no {stage} version", field="stage")
        return version_id

    def describe_version(self, version_id: str) -> dict[str, Any]:
        """One version: its columns, the pointers naming it, its manifest with the lifecycle
        fields filled in, and its validation runs.

        Raises:
            NotFound: no such version.
        """
        version = self._store.get_version(version_id)
        runs = self._store.validation_runs(version_id)
        adapter = self._store.get_adapter(version.name)
        pointers = [p.value for p in Pointer if adapter.pointer(p) == version_id]
        deployed_at = self._store.deployed_at(version.name, "production") if "production" in pointers else None
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

    # -- lifecycle ------------------------------------------------------------

    def promote(
        self,
        version_id: str,
        to: str,
        reason: str | None = None,
        on_planned: Callable[[Plan], None] | None = None,
        fleet_report: Callable[[], list[dict[str, Any]]] | None = None,
        acknowledge_scan_review: bool = False,
    ) -> Plan:
        """Move the canary or production pointer to ``version_id``; already there is a no-op.

        A version whose weight scan asked for review reaches production only with
        ``acknowledge_scan_review``, which the audit log then records (checked under the
        adapter's lock, with the signature).

        The version's stored bytes are verified first: a pointer never moves to a version
        whose blobs are missing or damaged. ``on_planned`` (the fleet switch) gets the plan
        under the adapter's lock before anything is written; if it raises, nothing moves.
        What the switch did (``fleet_report``) is audited in the move's own transaction, so
        the log never shows a move without its replicas, nor the reverse.

        Raises:
            InvalidInput: ILLEGAL_TRANSITION for a target that is not canary or production.
            IllegalTransition: the lifecycle forbids the move (VALIDATION_REQUIRED for a
                version whose latest validation did not pass; SCAN_REVIEW_UNACKNOWLEDGED for
                a version under scan review going to production unacknowledged).
            NotFound: no such version.
            IntegrityFailure: ARTIFACT_CORRUPTED, a blob of the version is missing or damaged.
        """
        try:
            target = Pointer(to)
        except ValueError as e:
            raise InvalidInput(
                f"--to must be canary or production, not {to!r}", code=ErrorCode.ILLEGAL_TRANSITION, field="to"
            ) from e
        action = Action.PROMOTE_PRODUCTION if target == Pointer.PRODUCTION else Action.PROMOTE_CANARY
        principal = self.principal
        if target == Pointer.PRODUCTION and acknowledge_scan_review and self.scan_under_review(version_id):
            reason = f"{reason}; weight-scan review acknowledged" if reason else "weight-scan review acknowledged"

        def verify_target(pointer: Pointer, vid: str, blobs: tuple[str, str, str]) -> None:
            self._verify_target(pointer, vid, blobs)
            if pointer == Pointer.PRODUCTION:
                self._require_scan_acknowledged(vid, acknowledge_scan_review)

        return self._store.apply_plan(
            lambda pointers, states: plan_promotion(pointers, states[version_id], target, states),
            subject=version_id,
            actor=principal.actor,
            reason=reason,
            verify_target=verify_target,
            on_planned=on_planned,
            before_commit=self._fleet_audit(principal.actor, reason, fleet_report),
            authorize=partial(principal.require, action),
        )

    def rollback(
        self,
        name: str,
        stage: str = "production",
        reason: str | None = None,
        on_planned: Callable[[Plan], None] | None = None,
        fleet_report: Callable[[], list[dict[str, Any]]] | None = None,
    ) -> Plan:
        """Production back to ``previous`` in one pointer move, or withdraw the canary.

        The version production returns to has its stored bytes verified first.

        Raises:
            InvalidInput: ILLEGAL_TRANSITION for a stage that is not canary or production.
            IllegalTransition: nothing to roll back, or no previous production.
            NotFound: no such adapter.
            IntegrityFailure: ARTIFACT_CORRUPTED, a blob of the previous version is damaged.
        """
        AdapterName.parse(name)
        try:
            target = Pointer(stage)
        except ValueError as e:
            raise InvalidInput(
                f"--stage must be canary or production, not {stage!r}",
                code=ErrorCode.ILLEGAL_TRANSITION,
                field="stage",
            ) from e
        actor = self._authorize(
            Action.ROLLBACK_PRODUCTION if target == Pointer.PRODUCTION else Action.WITHDRAW_CANARY, name
        )
        return self._store.apply_plan(
            lambda pointers, states: plan_rollback(pointers, target, states, name),
            name=name,
            actor=actor,
            reason=reason,
            verify_target=self._verify_target,
            on_planned=on_planned,
            before_commit=self._fleet_audit(actor, reason, fleet_report),
        )

    def _fleet_audit(
        self, actor: str, reason: str | None, fleet_report: Callable[[], list[dict[str, Any]]] | None
    ) -> Callable[[Any], None] | None:
        if fleet_report is None:
            return None
        return lambda conn: self._store.audit_fleet_actions(conn, actor, "deploy", fleet_report(), reason)

    def scan_under_review(self, version_id: str) -> WeightScan | None:
        """The weight scan of the version's latest validation when it asked for review
        (None when it did not, or no scan ran).

        Raises:
            NotFound: no such version.
        """
        self._store.get_version(version_id)
        runs = self._store.validation_runs(version_id)
        scan = runs[-1].report.scan if runs else None
        return scan if scan is not None and scan.under_review else None

    def _require_scan_acknowledged(self, version_id: str, acknowledged: bool) -> None:
        scan = self.scan_under_review(version_id)
        if scan is not None and not acknowledged:
            raise IllegalTransition(
                f"{version_id} is under weight-scan review ({scan.describe()}): production needs an explicit "
                "acknowledgement (--acknowledge-scan-review, or the approval form's acknowledge_scan_review)",
                code=ErrorCode.SCAN_REVIEW_UNACKNOWLEDGED,
                field="acknowledge_scan_review",
            )

    def _verify_target(self, pointer: Pointer, version_id: str, blobs: tuple[str, str, str]) -> None:
        for hexdigest in blobs:
            self._artifacts.verify(digest_of_hex(hexdigest))
        if pointer == Pointer.PRODUCTION:
            # promotion and rollback alike: production only ever serves signed bytes
            self.verify_signature(version_id)

    def verify_blobs(self, version_id: str) -> None:
        """Check that the version's three blobs are stored and match their digests.

        Raises:
            NotFound: no such version.
            IntegrityFailure: ARTIFACT_CORRUPTED naming the blob.
        """
        version = self._store.get_version(version_id)
        for hexdigest in version.blob_digests:
            self._artifacts.verify(digest_of_hex(hexdigest))

    # -- bundles --------------------------------------------------------------

    def materialize(self, version_id: str, dest: Path) -> Path:
        """Write the version's bundle to ``dest`` atomically, for a replica to load.

        An existing ``dest`` holding exactly this bundle is left alone: a replica may be
        reading it, and vLLM re-reads evicted adapters from their path.

        Raises:
            NotFound: no such version.
            AlreadyExists: ``dest`` exists with other content.
            IntegrityFailure: a stored blob is missing or corrupted.
        """
        version = self._store.get_version(version_id)
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
        sweep(dest.parent, self.settings.litter_age_s)  # fetches of crashed materializes
        with scratch_dir("fetch", dest.parent, hidden=True) as staging:
            for name in BUNDLE_FILES:
                self._artifacts.fetch_to(digest_of_hex(expected[name]), staging / name)
            publish_dir(staging, dest)
        return dest

    # -- tokens -------------------------------------------------------------------

    def create_token(self, role: str, holder: str, namespace: str | None = None) -> tuple[TokenRecord, str]:
        """A new token for ``holder`` (a person or a pipeline), bound to ``role`` and,
        optionally, a namespace pattern; returns its record and the token, shown once.

        Raises:
            PermissionDenied: not an admin.
            InvalidInput: an unknown role, a bad namespace pattern or an empty holder.
        """
        actor = self._authorize(Action.MANAGE_TOKENS)
        parsed = parse_role(role)
        pattern = check_namespace(namespace)
        holder = holder.strip()
        if not holder or len(holder) > MAX_HOLDER:
            raise InvalidInput(f"holder must name who holds the token (1-{MAX_HOLDER} characters)", field="holder")
        issued = issue_token()
        return self._store.create_token(issued, parsed, pattern, holder, actor), issued.token

    def revoke_token(self, token_id: str) -> TokenRecord:
        """Raises:
        PermissionDenied: not an admin.
        NotFound: no such token.
        """
        return self._store.revoke_token(token_id, self._authorize(Action.MANAGE_TOKENS))

    def list_tokens(self) -> list[TokenRecord]:
        """Raises:
        PermissionDenied: not an admin.
        """
        self._authorize(Action.MANAGE_TOKENS)
        return self._store.tokens()

    # -- signing keys and signatures -------------------------------------------------

    def add_signing_key(self, public_pem: bytes, role: str, holder: str) -> tuple[SigningKey, bool]:
        """Register a public key for ``role`` (a production signature must be by a
        ``signing`` key); the same key again is a no-op.

        Raises:
            PermissionDenied: not an admin.
            InvalidInput: not an EC public key, an unknown role, an empty holder.
            AlreadyExists: the key is registered for another role or holder.
        """
        actor = self._authorize(Action.MANAGE_KEYS)
        parsed = parse_role(role)
        if not holder.strip() or len(holder.strip()) > MAX_HOLDER:
            raise InvalidInput(
                f"holder must name who holds the private key (1-{MAX_HOLDER} characters)", field="holder"
            )
        key = SigningKey(
            key_id=key_id(public_pem),
            public_pem=public_pem,
            role=parsed,
            holder=holder.strip(),
            created_at=utcnow(),
            created_by=actor,
        )
        return self._store.add_signing_key(key, actor)

    def revoke_signing_key(self, key: str) -> SigningKey:
        """Raises:
        PermissionDenied: not an admin.
        NotFound: no such key.
        """
        return self._store.revoke_signing_key(key, self._authorize(Action.MANAGE_KEYS))

    def list_signing_keys(self) -> list[SigningKey]:
        return self._store.signing_keys()

    def signatures(self, version_id: str) -> list[VersionSignature]:
        self._store.get_version(version_id)
        return self._store.signatures(version_id)

    def _passed_run(self, version: AdapterVersion) -> ValidationRun:
        runs = self._store.validation_runs(version.version_id)
        if not runs or runs[-1].status != ValidationStatus.PASSED:
            raise IllegalTransition(
                f"{version.version_id} has not passed validation: only a validated version is signed",
                code=ErrorCode.VALIDATION_REQUIRED,
                field="version",
            )
        return runs[-1]

    def _signing_dir(self, version: AdapterVersion, run: ValidationRun, dest: Path, source: Path | None) -> Path:
        """The signed parts side by side: the bundle (from ``source``, the bytes a replica
        is given, or from the artifact store) and the validation report."""
        if source is None:
            for file, hexdigest in zip(BUNDLE_FILES, _bundle_digests(version), strict=True):
                self._artifacts.fetch_to(digest_of_hex(hexdigest), dest / file)
        else:
            for file in BUNDLE_FILES:
                if not (source / file).is_file():
                    raise SignatureInvalid(f"{source} has no {file} to verify", field="bundle")
                shutil.copyfile(source / file, dest / file)
        write_signed_report(dest, signed_report(version, run))
        return dest

    def sign_version(self, version_id: str, private_pem: bytes) -> tuple[VersionSignature, bool]:
        """Sign the version's bundle and its latest (passed) validation report with a key
        registered for the ``signing`` role; signing again with the same key is a no-op.

        Raises:
            PermissionDenied: no ``signing`` role, or a key that is not an active signing key.
            IllegalTransition: VALIDATION_REQUIRED, the latest validation did not pass.
            InvalidInput: the private key cannot be read (never echoed).
        """
        version = self._store.get_version(version_id)
        actor = self._authorize(Action.SIGN, version.name)
        kid = key_id(public_key_of(private_pem))
        key = self._store.signing_key(kid)
        if key is None or not key.active or key.role != Role.SIGNING:
            why = "not registered" if key is None else "revoked" if not key.active else f"a {key.role.value} key"
            raise PermissionDenied(f"key {kid} is {why}: production takes a signing key's signature", field="key")
        run = self._passed_run(version)
        with tempfile.TemporaryDirectory(prefix="loragate-sign-") as tmp:
            signed = self._signing_dir(version, run, Path(tmp), None)
            signature = sign_directory(signed, private_pem)
            verify_directory(signed, signature, key.public_pem)
            report_sha256 = sha256_file(signed / SIGNED_REPORT_FILE)
        return self._store.record_signature(version_id, kid, run.id, report_sha256, signature, actor)

    def verify_signature(self, version_id: str, bundle_dir: Path | None = None) -> VersionSignature:
        """The signature production relies on: by an active ``signing`` key, over this
        version's bytes (``bundle_dir``: the copy a replica is given; else the stored
        blobs) and its latest validation report, which must have passed.

        Raises:
            IllegalTransition: SIGNATURE_REQUIRED, never signed; VALIDATION_REQUIRED.
            SignatureInvalid: no signature verifies; the reasons say why each failed.
        """
        version = self._store.get_version(version_id)
        run = self._passed_run(version)
        signatures = self._store.signatures(version_id)
        if not signatures:
            raise IllegalTransition(
                f"{version_id} is not signed: production needs a signing key's signature (loragate sign)",
                code=ErrorCode.SIGNATURE_REQUIRED,
                field="version",
            )
        reasons = []
        for sig in reversed(signatures):
            try:
                self._check_signature(version, run, sig, bundle_dir)
                return sig
            except SignatureInvalid as e:
                reasons.append(f"{sig.key_id[:19]}: {e.message}")
        raise SignatureInvalid(f"{version_id}: no valid signature ({'; '.join(reasons)})", field="signature")

    def _check_signature(
        self, version: AdapterVersion, run: ValidationRun, sig: VersionSignature, bundle_dir: Path | None
    ) -> None:
        key = self._store.signing_key(sig.key_id)
        if key is None or not key.active:
            raise SignatureInvalid("by an unknown or revoked key")
        if key.role != Role.SIGNING:
            raise SignatureInvalid(f"by a {key.role.value} key, not a signing key")
        if sig.validation_run_id != run.id:
            raise SignatureInvalid(f"over validation run {sig.validation_run_id}, not the latest ({run.id})")
        stated = signed_digests(sig.signature)
        for file, hexdigest in zip(BUNDLE_FILES, _bundle_digests(version), strict=True):
            if stated.get(file) != hexdigest:
                raise SignatureInvalid(f"made over another version's {file}")
        with tempfile.TemporaryDirectory(prefix="loragate-verify-") as tmp:
            verify_directory(self._signing_dir(version, run, Path(tmp), bundle_dir), sig.signature, key.public_pem)

    # -- the fleet --------------------------------------------------------------

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
            InvalidInput: INVALID_SETTING for a bad URL, role or limit; UNKNOWN_BASE for a base
                or commit that is not pinned.
            AlreadyExists: the URL is in the fleet with another configuration.
            PermissionDenied: not an admin.
        """
        actor = self._authorize(Action.MANAGE_FLEET)
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
        try:
            replica_role = ReplicaRole(role)
        except ValueError as e:
            raise InvalidInput(
                f"role {role!r} is not canary or production", code=ErrorCode.INVALID_SETTING, field="role"
            ) from e
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
        pins = self._store.bases(base_model_id)
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
        return self._store.add_replica(replica, actor)

    def remove_replica(self, url: str) -> Replica:
        """Raises:
        NotFound: no replica with that URL.
        """
        return self._store.remove_replica(url.rstrip("/"), self._authorize(Action.MANAGE_FLEET))

    def list_replicas(self, base_model_id: str | None = None) -> list[Replica]:
        return self._store.replicas(base_model_id)

    def adapter_pointers(self, base_model_id: str | None = None) -> list[AdapterPointers]:
        return self._store.adapter_pointers(base_model_id)

    def record_fleet_actions(self, action: str, entries: list[dict[str, Any]], reason: str | None = None) -> None:
        """Audit what a switch or a reconcile did to the replicas."""
        actor = self._authorize_any(FLEET_MOVES)
        self._store.record_fleet_actions(actor, action, entries, reason)

    def expected_outputs(self, version_id: str) -> tuple[GoldenSet, dict[str, str]] | None:
        """The golden set and greedy outputs of the version's latest passed validation: what
        a replica serving it must answer. None when it never passed.

        Raises:
            IntegrityFailure: the stored golden set no longer matches its digest.
        """
        passed = [r for r in self._store.validation_runs(version_id) if r.status == ValidationStatus.PASSED]
        if not passed or passed[-1].golden_set_digest is None or not passed[-1].report.outputs:
            return None
        run = passed[-1]
        assert run.golden_set_digest is not None and run.report.outputs is not None
        golden = load_stored_golden_set(self._artifacts.read_bytes(run.golden_set_digest), run.golden_set_digest)
        return golden, run.report.outputs

    # -- the canary watch -------------------------------------------------------

    def open_canary_window(self, version_id: str) -> tuple[CanaryWindow, bool]:
        """Open the canary window of the adapter's current canary, with the thresholds the
        settings give now (the window keeps them); returns (window, created). Opening it
        again returns the active one; another version's active window is superseded.

        Raises:
            NotFound: no such version.
            IllegalTransition: the version is not the adapter's canary.
        """
        version = self._store.get_version(version_id)
        if self._store.resolve(version.name, Pointer.CANARY.value) != version_id:
            raise IllegalTransition(
                f"{version_id} is {version.stage.value}, not the canary of {version.name}: promote it to canary first",
                field="version_id",
            )
        actor = self._authorize(Action.WATCH_CANARY, version.name)
        thresholds = CanaryThresholds.from_settings(self.settings)
        return self._store.open_canary_window(version.name, version_id, thresholds, actor)

    def canary_windows(
        self, statuses: tuple[WindowStatus, ...] | None = ACTIVE, version_id: str | None = None
    ) -> list[CanaryWindow]:
        """Windows by status (active ones by default), oldest first."""
        return self._store.canary_windows(statuses=statuses, version_id=version_id)

    def canary_window(self, window_id: int) -> CanaryWindow:
        """Raises:
        NotFound: no such window.
        """
        return self._store.canary_window(window_id)

    def latest_canary_window(self, version_id: str) -> CanaryWindow:
        """The newest window of a version.

        Raises:
            NotFound: the version never had one.
        """
        self._store.get_version(version_id)
        windows = self._store.canary_windows(version_id=version_id)
        if not windows:
            raise NotFound(f"{version_id} has never been canaried", field="version_id")
        return windows[-1]

    def record_canary_observation(self, observation: Observation) -> Observation:
        """Store an observation; a READY verdict moves the window to ready.

        Raises:
            NotFound: no such window.
        """
        window = self._store.canary_window(observation.window_id)
        return self._store.record_canary_observation(
            observation, self._authorize(Action.WATCH_CANARY, window.adapter_name)
        )

    def canary_observations(self, window_id: int) -> list[Observation]:
        return self._store.canary_observations(window_id)

    def close_canary_window(self, window_id: int, status: WindowStatus, reason: str | None) -> CanaryWindow:
        """Move a window to ``status`` (already there: no-op).

        Raises:
            NotFound: no such window.
            IllegalTransition: the window cannot move there (a promoted window cannot be
                rolled back through its canary, say).
        """
        actor = self._authorize(Action.WATCH_CANARY, self._store.canary_window(window_id).adapter_name)
        return self._store.move_canary_window(window_id, status, reason, actor)

    def request_approval(self, window_id: int, flow_run_id: str, replacing: str | None = None) -> CanaryWindow:
        """Claim the window's sign-off for a flow run, unless another run holds it (the
        returned window says who does); ``replacing`` names a run known to be gone."""
        actor = self._authorize(Action.WATCH_CANARY, self._store.canary_window(window_id).adapter_name)
        return self._store.set_approval_run(window_id, flow_run_id, replacing, actor)

    def record_approval(
        self, window_id: int, *, approve: bool, reviewer: str, comment: str = "", flow_run_id: str | None = None
    ) -> CanaryWindow:
        """The sign-off decision with its reviewer and comment, into the audit log; a
        rejection closes the window.

        Raises:
            InvalidInput: INVALID_NAME for an empty reviewer.
            IllegalTransition: the window is not waiting for a sign-off.
        """
        if not reviewer.strip():
            raise InvalidInput("a decision needs a reviewer", code=ErrorCode.INVALID_NAME, field="reviewer")
        name = self._store.canary_window(window_id).adapter_name
        actor = self._authorize(Action.APPROVE, name)
        self.check_reviewer(reviewer.strip(), name)
        return self._store.record_approval(
            window_id,
            approve=approve,
            reviewer=reviewer.strip(),
            comment=comment,
            flow_run_id=flow_run_id,
            actor=actor,
        )

    def check_reviewer(self, reviewer: str, name: str) -> TokenRecord:
        """The reviewer of a production sign-off must hold an active ``activation`` token
        covering the adapter (tokens name their holder); returns that token's record.

        Raises:
            PermissionDenied: nobody by that name holds one.
        """
        for record in self._store.tokens():
            if record.holder == reviewer and record.active and Principal.of_token(record).may(Action.APPROVE, name):
                return record
        raise PermissionDenied(
            f"reviewer {reviewer!r} holds no active activation token for {name}: nothing was moved",
            field="reviewer",
        )

    # -- garbage ----------------------------------------------------------------

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
        referenced = self._store.referenced_digests()
        candidates = [b for b in self._artifacts.blobs() if b.digest not in referenced and b.age_s > age]
        if candidates and not dry_run:
            referenced = self._store.referenced_digests()  # anything committed meanwhile is kept
        orphans = [b for b in candidates if b.digest not in referenced]
        freed = 0
        if not dry_run:
            freed += self._artifacts.remove_litter(store_litter) + remove(scratch_litter)
            for blob in orphans:
                self._artifacts.delete(blob.digest)
                freed += blob.size
            if litter or orphans:
                details = {"litter": len(litter), "orphan_blobs": len(orphans), "bytes_freed": freed}
                self._store.record_gc(actor, details)
        return GcReport(litter=litter, orphans=orphans, removed=not dry_run, freed_bytes=freed)

    # -- golden sets ----------------------------------------------------------

    def attach_golden_set(self, name: str, path: Path) -> GoldenSetRef:
        """Check a golden set (JSONL) and attach it to ``name``.

        Raises:
            InvalidInput: INVALID_GOLDEN_SET naming every failed expectation, TOO_LARGE,
                INVALID_BUNDLE for a path that is not a regular file.
            NotFound: no such adapter.
        """
        AdapterName.parse(name)
        self._store.get_adapter(name)
        actor = self._authorize(Action.REGISTER, name)
        raw = read_regular_file(
            Path(path), self.settings.max_json_bytes, field="golden_set", code=ErrorCode.INVALID_GOLDEN_SET
        )
        current = self._store.current_golden_set(name)
        if current is not None and digest_if_parseable(raw, self.settings.golden_max_cases) == current.digest:
            # the set attached now, checked when it was attached: a training job sends it with
            # every version, and the great-expectations suite costs ~2 s in a fresh process
            return current
        golden = parse_golden_set(
            raw, min_cases=self.settings.golden_min_cases, max_cases=self.settings.golden_max_cases
        )
        self._artifacts.put_bytes(golden.digest, golden.canonical_bytes())
        return self._store.attach_golden_set(name, golden.digest, len(golden.cases), actor)

    def golden_set(self, name: str) -> tuple[GoldenSetRef, GoldenSet]:
        """The golden set attached to ``name`` now.

        Raises:
            NotFound: no such adapter, or no golden set attached.
            IntegrityFailure: the stored set no longer matches its digest.
        """
        ref = self._store.current_golden_set(name)
        if ref is None:
            self._store.get_adapter(name)
            raise NotFound(f"{name} has no golden set attached (loragate golden set {name} FILE)", field="golden_set")
        return ref, load_stored_golden_set(self._artifacts.read_bytes(ref.digest), ref.digest)

    # -- validation runs ------------------------------------------------------

    def record_validation(
        self, version_id: str, report: ValidationReport, started_at: datetime, finished_at: datetime
    ) -> ValidationRun:
        """Store a validation report; a failed staging version becomes ``rejected``.

        Raises:
            NotFound: no such version.
        """
        actor = self._authorize(Action.VALIDATE, self._store.get_version(version_id).name)
        return self._store.record_validation(
            version_id,
            lambda state: plan_validation_result(state, report.status),
            report,
            started_at=started_at,
            finished_at=finished_at,
            actor=actor,
        )

    def validation_runs(self, version_id: str) -> list[ValidationRun]:
        return self._store.validation_runs(version_id)

    def reference_run_for(self, version: AdapterVersion) -> ValidationRun | None:
        """What a new validation of ``version`` is compared with: its own last passed run
        (reproducibility), else the newest passed run of an older version (drift)."""
        own = [r for r in self._store.validation_runs(version.version_id) if r.status == ValidationStatus.PASSED]
        if own:
            return own[-1]
        return self._store.latest_passed_run_before(version.name, version.created_at, version.version_id)
