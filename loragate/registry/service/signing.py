"""Signatures production relies on: a ``signing`` key signs a validated version's bundle
together with its latest (passed) validation report (``model_signing``, offline EC keys);
production takes a version only when such a signature verifies over the stored bytes, and
a production replica's copy is verified again on the bytes it is given."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from loragate.registry.digests import digest_of_hex, sha256_file
from loragate.registry.errors import ErrorCode, IllegalTransition, PermissionDenied, SignatureInvalid
from loragate.registry.records.adapters import AdapterVersion, ValidationRun
from loragate.registry.rules.access import Action, Role, VersionSignature
from loragate.registry.rules.lifecycle import ValidationStatus
from loragate.registry.service.base import RegistryBase
from loragate.registry.storage.bundle_files import ADAPTER_CONFIG_FILE, BUNDLE_FILES, MANIFEST_FILE, WEIGHTS_FILE
from loragate.registry.storage.signing import (
    SIGNED_REPORT_FILE,
    key_id,
    public_key_of,
    sign_directory,
    signed_digests,
    verify_directory,
    write_signed_report,
)


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


class SigningMixin(RegistryBase):
    def signatures(self, version_id: str) -> list[VersionSignature]:
        self._store.versions.get(version_id)
        return self._store.access.signatures(version_id)

    def _passed_run(self, version: AdapterVersion) -> ValidationRun:
        runs = self._store.validation.runs(version.version_id)
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
        version = self._store.versions.get(version_id)
        actor = self._authorize(Action.SIGN, version.name)
        kid = key_id(public_key_of(private_pem))
        key = self._store.access.signing_key(kid)
        if key is None or not key.active or key.role != Role.SIGNING:
            why = "not registered" if key is None else "revoked" if not key.active else f"a {key.role.value} key"
            raise PermissionDenied(f"key {kid} is {why}: production takes a signing key's signature", field="key")
        run = self._passed_run(version)
        with tempfile.TemporaryDirectory(prefix="loragate-sign-") as tmp:
            signed = self._signing_dir(version, run, Path(tmp), None)
            signature = sign_directory(signed, private_pem)
            verify_directory(signed, signature, key.public_pem)
            report_sha256 = sha256_file(signed / SIGNED_REPORT_FILE)
        return self._store.access.record_signature(
            version_id, version.name, kid, run.id, report_sha256, signature, actor
        )

    def verify_signature(self, version_id: str, bundle_dir: Path | None = None) -> VersionSignature:
        """The signature production relies on: by an active ``signing`` key, over this
        version's bytes (``bundle_dir``: the copy a replica is given; else the stored
        blobs) and its latest validation report, which must have passed.

        Raises:
            IllegalTransition: SIGNATURE_REQUIRED, never signed; VALIDATION_REQUIRED.
            SignatureInvalid: no signature verifies; the reasons say why each failed.
        """
        version = self._store.versions.get(version_id)
        run = self._passed_run(version)
        signatures = self._store.access.signatures(version_id)
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
        key = self._store.access.signing_key(sig.key_id)
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
