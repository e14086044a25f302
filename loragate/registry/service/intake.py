"""Intake: pinning base models and registering bundles.

Every check on an incoming bundle runs before anything is written, so a rejected register
leaves no row and no blob; only then are blobs stored (content-addressed, so a repeat
uploads nothing) and the version row inserted in one transaction.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any

from loragate.registry.digests import canonical_json, digest_of_hex, sha256_bytes
from loragate.registry.errors import ErrorCode, InvalidInput, NotFound
from loragate.registry.intake.binding import binding_mismatches
from loragate.registry.intake.bundle import (
    BundleSnapshot,
    check_adapter_config,
    check_weights_against,
    parse_adapter_config,
    snapshot_bundle,
)
from loragate.registry.intake.catalog import inspect_base
from loragate.registry.intake.manifest import Manifest, content_address, parse_json_object, parse_manifest
from loragate.registry.intake.weights import inspect_lora_weights
from loragate.registry.progress import Progress, quiet
from loragate.registry.records.adapters import AdapterVersion
from loragate.registry.records.bases import BaseModelRecord
from loragate.registry.rules.access import Action
from loragate.registry.rules.lifecycle import Stage, ValidationStatus
from loragate.registry.rules.names import AdapterName
from loragate.registry.service.base import RegistryBase
from loragate.registry.storage.bundle_files import BUNDLE_FILES, MANIFEST_FILE
from loragate.registry.storage.s3_store import fetch_s3_bundle
from loragate.registry.storage.scratch import scratch_dir, sweep


@dataclass(frozen=True)
class RegisterResult:
    version: AdapterVersion
    created: bool
    uploaded_blobs: int


class IntakeMixin(RegistryBase):
    def add_base(self, source: str, base_model_id: str, revision: str | None = None) -> tuple[BaseModelRecord, bool]:
        """Pin a base model; returns (record, created).

        Raises:
            InvalidInput: INVALID_BASE / INVALID_NAME for a source, id or revision that
                cannot be pinned; AlreadyExists for the same pin with other content.
        """
        actor = self._authorize(Action.MANAGE_BASES)
        record = inspect_base(source, base_model_id, revision, self.settings.hf_cache_dir)
        return self._store.catalog.add(record, actor)

    def list_bases(self, base_model_id: str | None = None) -> list[BaseModelRecord]:
        return self._store.catalog.bases(base_model_id)

    def get_base(self, base_model_id: str, commit: str) -> BaseModelRecord:
        """Raises:
        NotFound: no such pin in the catalog.
        """
        base = self._store.catalog.get(base_model_id, commit)
        if base is None:
            raise NotFound(f"base {base_model_id}@{commit} is not in the catalog", field="base_model_commit")
        return base

    def _bind_base(self, manifest: Manifest) -> BaseModelRecord:
        base = self._store.catalog.get(manifest.base_model_id, manifest.base_model_commit)
        if base is not None:
            return base
        pinned = [b.base_model_commit for b in self._store.catalog.bases(manifest.base_model_id)]
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

    def register_adapter(self, bundle_dir: Path, name: str, progress: Progress = quiet) -> RegisterResult:
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
            existing = self._store.versions.find_by_content(str(adapter_name), address)
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

    def register_from(self, location: str, name: str, progress: Progress = quiet) -> RegisterResult:
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

        version, created = self._store.versions.insert(name, address, snap.weights_sha256, finalize, actor=actor)
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
