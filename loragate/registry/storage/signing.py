"""Signatures over an adapter bundle directory (OpenSSF ``model_signing``, EC keys, offline).

One signature covers exactly the signed files: the bundle's three files and the validation
report written beside them, so a signed version says "these weights, this config and this
manifest passed this validation". The signature is a Sigstore bundle: a DSSE envelope around
an in-toto statement listing each file's sha256, signed with an EC key (no transparency log).
A key is named by ``key_id``, the sha256 of its DER SubjectPublicKeyInfo. Other files beside
a bundle (a replica's own files) are neither signed nor a reason to refuse.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from loragate.registry.digests import CHUNK, SHA256_HEX, canonical_json, digest_of_hex, sha256_bytes, sha256_file
from loragate.registry.errors import ErrorCode, InvalidInput, SignatureInvalid
from loragate.registry.storage.bundle_files import BUNDLE_FILES, open_regular
from loragate.registry.storage.scratch import scratch_dir

if TYPE_CHECKING:
    import model_signing.hashing

SIGNED_REPORT_FILE = "loragate-validation.json"
_SIGNED = (*BUNDLE_FILES, SIGNED_REPORT_FILE)
# the curves model_signing accepts
_CURVES = ("secp256r1", "secp384r1", "secp521r1")
_IN_TOTO = "application/vnd.in-toto+json"


@dataclass(frozen=True)
class KeyPair:
    private_pem: bytes = field(repr=False)  # a logged KeyPair must not show it
    public_pem: bytes


def generate_key_pair() -> KeyPair:
    """A fresh EC P-256 key pair: PKCS8 private key (unencrypted), SubjectPublicKeyInfo public key."""
    key = ec.generate_private_key(ec.SECP256R1())
    return KeyPair(
        private_pem=key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
        public_pem=_public_pem(key.public_key()),
    )


def _public_pem(key: ec.EllipticCurvePublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def _bad_key(which: str) -> InvalidInput:
    # never the key bytes, never the parser's message: either may quote the input
    return InvalidInput(
        f"{which} is not a PEM EC key on {', '.join(_CURVES)}", code=ErrorCode.SIGNATURE_INVALID, field=which
    )


def _load_public(public_pem: bytes) -> ec.EllipticCurvePublicKey:
    try:
        key = serialization.load_pem_public_key(public_pem)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        raise _bad_key("public_key") from None
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name not in _CURVES:
        raise _bad_key("public_key")
    return key


def _load_private(private_pem: bytes) -> ec.EllipticCurvePrivateKey:
    try:
        # an encrypted key raises TypeError here: keys are passed unencrypted
        key = serialization.load_pem_private_key(private_pem, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        raise _bad_key("private_key") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.name not in _CURVES:
        raise _bad_key("private_key")
    return key


def key_id(public_pem: bytes) -> str:
    """``sha256:<hex>`` of the key's DER SubjectPublicKeyInfo: the same whatever the PEM's layout.

    Raises:
        InvalidInput: SIGNATURE_INVALID, field ``public_key``, for what is not a PEM EC public key.
    """
    der = _load_public(public_pem).public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return digest_of_hex(sha256_bytes(der))


def public_key_of(private_pem: bytes) -> bytes:
    """The PEM public key of a PEM private key.

    Raises:
        InvalidInput: SIGNATURE_INVALID, field ``private_key``, for what is not an unencrypted
            PEM EC private key (the message never quotes it).
    """
    return _public_pem(_load_private(private_pem).public_key())


def signed_files() -> list[str]:
    """The files, relative to a bundle directory, that every signature covers: no more, no fewer."""
    return list(_SIGNED)


def write_signed_report(directory: Path, report: dict[str, Any]) -> Path:
    """Write ``report`` as canonical JSON to ``directory/SIGNED_REPORT_FILE``, where the signature covers it."""
    path = Path(directory) / SIGNED_REPORT_FILE
    path.write_bytes(canonical_json(report))
    return path


def _hashing() -> model_signing.hashing.Config:
    import model_signing.hashing

    # pinned on both sides, never guessed from the signature: a signature does not choose
    # how it is checked; nothing ignored, so the statement records no ignore list
    return (
        model_signing.hashing.Config()
        .set_ignored_paths(paths=[], ignore_git_paths=False)
        .use_file_serialization(hashing_algorithm="sha256", allow_symlinks=False)
    )


def sign_directory(directory: Path, private_pem: bytes) -> bytes:
    """Sign exactly ``signed_files()`` of ``directory``; returns the Sigstore bundle's bytes.

    Raises:
        InvalidInput: SIGNATURE_INVALID (field ``private_key``) for a key that is not an
            unencrypted PEM EC private key; INVALID_BUNDLE naming a signed file that is
            missing or not a regular file.
    """
    _load_private(private_pem)
    import model_signing.signing  # 0.5 s to import: only the commands that sign pay it

    with scratch_dir("sign") as tmp:
        # model_signing's signer hashes every file under the path it is given (its
        # files_to_hash exists on the verifying side only) and ignore_paths is a deny list
        # that would have to name whatever else lies there and be recorded in the statement;
        # a private copy of just the signed files is signed instead, and what is hashed is
        # a snapshot no other writer can change mid-way
        stage = tmp / "bundle"
        stage.mkdir()
        for name in _SIGNED:
            with (
                os.fdopen(open_regular(Path(directory) / name, field=name), "rb") as src,
                open(stage / name, "wb") as dst,
            ):
                shutil.copyfileobj(src, dst, CHUNK)
        key_path, signature_path = tmp / "key.pem", tmp / "signature.json"
        try:
            with os.fdopen(os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
                f.write(private_pem)
            config = model_signing.signing.Config().set_hashing_config(_hashing())
            config.use_elliptic_key_signer(private_key=key_path).sign(stage, signature_path)
        finally:
            key_path.unlink(missing_ok=True)
        return signature_path.read_bytes()


def signed_digests(signature: bytes) -> dict[str, str]:
    """File name -> bare sha256 hex, as the signature's in-toto statement states them.

    This reads the statement without checking who signed it: compare these digests (say,
    the weights' with a version's ``weights_sha256``) only after ``verify_directory``.

    Raises:
        SignatureInvalid: the bytes are not a Sigstore bundle whose DSSE payload lists
            per-file sha256 digests.
    """
    try:
        envelope = json.loads(signature)["dsseEnvelope"]
        if envelope["payloadType"] != _IN_TOTO:
            raise SignatureInvalid("the signature's payload is not an in-toto statement", field="signature")
        predicate = json.loads(base64.b64decode(envelope["payload"], validate=True))["predicate"]
        if predicate["serialization"]["method"] != "files":
            raise SignatureInvalid("the signature does not list whole files", field="signature")
        digests: dict[str, str] = {}
        for resource in predicate["resources"]:
            name, digest = resource["name"], resource["digest"]
            sha256 = resource["algorithm"] == "sha256" and SHA256_HEX.match(digest)
            if not isinstance(name, str) or name in digests or not sha256:
                raise SignatureInvalid("the signature lists a file twice or without a sha256", field="signature")
            digests[name] = digest
    except (ValueError, KeyError, IndexError, TypeError):
        raise SignatureInvalid(
            "the signature is not a Sigstore bundle with per-file digests", field="signature"
        ) from None
    return digests


def verify_directory(directory: Path, signature: bytes, public_pem: bytes) -> None:
    """Check that ``signature`` was made by ``public_pem``'s key over the signed files of ``directory``.

    Files beside the signed ones are ignored: a replica may hold others.

    Raises:
        InvalidInput: SIGNATURE_INVALID, field ``public_key``, for what is not a PEM EC public key.
        SignatureInvalid: a malformed signature, or one over another set of files (field
            ``signature``); a signed file missing, not a regular file, or whose bytes differ
            from the signed ones (field: that file); a signature by another key or altered
            after signing (field ``signature``).
    """
    directory = Path(directory)
    _load_public(public_pem)
    stated = signed_digests(signature)
    if sorted(stated) != sorted(_SIGNED):
        raise SignatureInvalid(
            f"the signature covers {sorted(stated)}, not the signed files {sorted(_SIGNED)}", field="signature"
        )
    for name in _SIGNED:
        try:
            mode = os.lstat(directory / name).st_mode
        except FileNotFoundError:
            raise SignatureInvalid(f"a signed file is missing: {name}", field=name) from None
        if not stat.S_ISREG(mode):
            raise SignatureInvalid(f"a signed file is not a regular file: {name}", field=name)
    import model_signing.verifying  # 0.5 s to import: only the commands that verify pay it

    with scratch_dir("verify") as tmp:
        key_path, signature_path = tmp / "public.pem", tmp / "signature.json"
        key_path.write_bytes(public_pem)
        signature_path.write_bytes(signature)
        # in place, no copy: with ignore_unsigned_files the verifier hashes only the files
        # the statement lists, just checked to be exactly the signed ones
        config = model_signing.verifying.Config().set_hashing_config(_hashing()).set_ignore_unsigned_files(True)
        try:
            config.use_elliptic_key_verifier(public_key=key_path).verify(directory, signature_path)
        except (ValueError, KeyError, IndexError, TypeError, InvalidSignature):
            # model_signing raises ValueError alike for a key mismatch, a changed file and a
            # malformed bundle, and says which file only in its message: name the file from
            # the digests the statement states, recomputed here
            changed = [name for name in _SIGNED if sha256_file(directory / name) != stated[name]]
            if changed:
                raise SignatureInvalid(
                    f"{', '.join(changed)}: bytes differ from the signed ones (sha256 mismatch)", field=changed[0]
                ) from None
            raise SignatureInvalid("signed by another key, or the signature was altered", field="signature") from None
