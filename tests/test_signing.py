"""Tamper suite for bundle signatures, on a real adapter bundle and real model_signing.

Each test copies the session's random adapter bundle, writes a validation report beside it
and signs the directory; then one thing is changed -- a byte, the key, the version, the
signature, a file -- and the signature must be refused with a typed error naming the part.
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import tempfile
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from loragate.registry.errors import ErrorCode, InvalidInput, SignatureInvalid
from loragate.registry.storage.bundle_files import WEIGHTS_FILE
from loragate.registry.storage.scratch import scratch_name
from loragate.registry.storage.signing import (
    SIGNED_REPORT_FILE,
    KeyPair,
    generate_key_pair,
    key_id,
    public_key_of,
    sign_directory,
    signed_digests,
    signed_files,
    verify_directory,
    write_signed_report,
)

REPORT = {"adapter": "acme/tiny-llama/support", "passed": True, "golden_pass_rate": 0.95, "checks": ["nan", "rank"]}


@pytest.fixture(scope="module")
def keys() -> KeyPair:
    return generate_key_pair()


def signable(src: Path, dest: Path) -> Path:
    shutil.copytree(src, dest)
    write_signed_report(dest, REPORT)
    return dest


@pytest.fixture
def bundle(random_bundle, tmp_path) -> Path:
    return signable(random_bundle, tmp_path / "v1")


@pytest.fixture
def signature(bundle, keys) -> bytes:
    return sign_directory(bundle, keys.private_pem)


def refusal(directory: Path, signature: bytes, public_pem: bytes) -> SignatureInvalid:
    with pytest.raises(SignatureInvalid) as caught:
        verify_directory(directory, signature, public_pem)
    assert caught.value.code == ErrorCode.SIGNATURE_INVALID
    return caught.value


def restated(signature: bytes, edit) -> bytes:
    """The signature with its in-toto statement edited and re-encoded, the ECDSA signature kept."""
    bundle = json.loads(signature)
    statement = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"]))
    edit(statement)
    bundle["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    return json.dumps(bundle).encode()


# -- what verifies ---------------------------------------------------------------------


def test_a_signature_verifies_on_the_bytes_it_was_made_over(bundle, signature, keys):
    verify_directory(bundle, signature, keys.public_pem)


def test_a_signature_verifies_on_a_copy_elsewhere_beside_unrelated_files(bundle, signature, keys, tmp_path):
    replica = tmp_path / "replica" / "acme--support--v1"
    shutil.copytree(bundle, replica)
    (replica / "README.md").write_text("not signed, not refused")
    (replica / "cache").mkdir()
    (replica / "cache" / "index.json").write_text("{}")
    verify_directory(replica, signature, keys.public_pem)


def test_the_report_is_written_as_canonical_json(bundle):
    raw = (bundle / SIGNED_REPORT_FILE).read_bytes()
    assert raw == json.dumps(REPORT, sort_keys=True, separators=(",", ":")).encode()


def test_signed_digests_are_the_sha256_of_each_signed_file(bundle, signature):
    expected = {name: hashlib.sha256((bundle / name).read_bytes()).hexdigest() for name in signed_files()}
    assert signed_digests(signature) == expected


def test_signing_leaves_no_key_or_scratch_behind(bundle, keys):
    sign_directory(bundle, keys.private_pem)
    assert list(Path(tempfile.gettempdir()).glob(scratch_name("sign") + "*")) == []
    assert sorted(p.name for p in bundle.iterdir()) == sorted(signed_files())


# -- what is refused -------------------------------------------------------------------


@pytest.mark.parametrize("name", signed_files())
def test_one_flipped_byte_in_any_signed_file_is_refused_naming_it(bundle, signature, keys, name):
    path = bundle / name
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    err = refusal(bundle, signature, keys.public_pem)
    assert err.field == name
    assert name in err.message


@pytest.mark.parametrize("name", signed_files())
def test_a_missing_signed_file_is_refused_naming_it(bundle, signature, keys, name):
    (bundle / name).unlink()
    err = refusal(bundle, signature, keys.public_pem)
    assert (err.field, name in err.message) == (name, True)


def test_a_signed_file_replaced_by_a_symlink_is_refused(bundle, signature, keys, tmp_path):
    outside = tmp_path / "weights-elsewhere"
    (bundle / WEIGHTS_FILE).rename(outside)
    (bundle / WEIGHTS_FILE).symlink_to(outside)
    assert refusal(bundle, signature, keys.public_pem).field == WEIGHTS_FILE


def test_a_signature_by_an_unknown_key_is_refused(bundle, keys):
    stranger = generate_key_pair()
    err = refusal(bundle, sign_directory(bundle, stranger.private_pem), keys.public_pem)
    assert err.field == "signature"


def test_a_signature_made_over_another_version_is_refused(bundle, signature, keys, tiny_base, tmp_path):
    from kit.modelkit import random_adapter

    other = signable(random_adapter(tiny_base, tmp_path / "seed-1", seed=1), tmp_path / "v2")
    assert (other / WEIGHTS_FILE).read_bytes() != (bundle / WEIGHTS_FILE).read_bytes()
    err = refusal(other, signature, keys.public_pem)
    assert err.field == WEIGHTS_FILE


def _truncate(sig: bytes) -> bytes:
    return sig[: len(sig) // 2]


def _payload_not_base64(sig: bytes) -> bytes:
    bundle = json.loads(sig)
    bundle["dsseEnvelope"]["payload"] = "!" + bundle["dsseEnvelope"]["payload"]
    return json.dumps(bundle).encode()


def _drop_report(statement: dict) -> None:
    resources = statement["predicate"]["resources"]
    resources[:] = [r for r in resources if r["name"] != SIGNED_REPORT_FILE]


def _rename_weights(statement: dict) -> None:
    for r in statement["predicate"]["resources"]:
        if r["name"] == WEIGHTS_FILE:
            r["name"] = "../" + WEIGHTS_FILE


@pytest.mark.parametrize(
    "mangle",
    [
        pytest.param(_truncate, id="truncated"),
        pytest.param(lambda sig: b"", id="empty"),
        pytest.param(lambda sig: b"\xff\xfe not json", id="garbage"),
        pytest.param(lambda sig: b"[]", id="json-not-a-bundle"),
        pytest.param(_payload_not_base64, id="payload-not-base64"),
        pytest.param(lambda sig: restated(sig, _drop_report), id="covers-fewer-files"),
        pytest.param(lambda sig: restated(sig, _rename_weights), id="covers-a-path-outside"),
        pytest.param(lambda sig: restated(sig, lambda s: s["subject"][0].update(name="other")), id="statement-edited"),
    ],
)
def test_a_malformed_or_altered_signature_is_refused_as_signature_invalid(bundle, signature, keys, mangle):
    assert refusal(bundle, mangle(signature), keys.public_pem).field == "signature"


def test_a_statement_rewritten_to_match_tampered_weights_is_refused(bundle, signature, keys):
    weights = bundle / WEIGHTS_FILE
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01
    weights.write_bytes(bytes(data))
    forged_digest = hashlib.sha256(bytes(data)).hexdigest()

    def restate_weights(statement: dict) -> None:
        for r in statement["predicate"]["resources"]:
            if r["name"] == WEIGHTS_FILE:
                r["digest"] = forged_digest

    forged = restated(signature, restate_weights)
    assert signed_digests(forged)[WEIGHTS_FILE] == forged_digest
    assert refusal(bundle, forged, keys.public_pem).field == "signature"


@pytest.mark.parametrize("name", signed_files())
def test_signing_refuses_a_bundle_missing_a_signed_file(bundle, keys, name):
    (bundle / name).unlink()
    with pytest.raises(InvalidInput) as caught:
        sign_directory(bundle, keys.private_pem)
    assert (caught.value.code, caught.value.field) == (ErrorCode.INVALID_BUNDLE, name)


# -- keys ------------------------------------------------------------------------------


def test_key_id_is_stable_per_key_and_differs_between_keys(keys):
    other = generate_key_pair()
    assert key_id(keys.public_pem) == key_id(keys.public_pem) == key_id(public_key_of(keys.private_pem))
    assert key_id(keys.public_pem) != key_id(other.public_pem)
    der = serialization.load_pem_public_key(keys.public_pem).public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    assert key_id(keys.public_pem) == "sha256:" + hashlib.sha256(der).hexdigest()


def test_a_key_pair_never_shows_its_private_key(keys):
    assert keys.private_pem.decode() not in repr(keys)
    assert b"PRIVATE KEY" not in repr(keys).encode()


def _ed25519_public_pem() -> bytes:
    return (
        ed25519.Ed25519PrivateKey.generate()
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )


GARBAGE_PEM = b"-----BEGIN PUBLIC KEY-----\nTk9UQUtFWWJ1dGxvb2tzbGlrZW9uZQ==\n-----END PUBLIC KEY-----\n"


@pytest.mark.parametrize(
    "call, pem_of, field",
    [
        pytest.param(key_id, lambda k: GARBAGE_PEM, "public_key", id="key_id-garbage"),
        pytest.param(key_id, lambda k: k.private_pem, "public_key", id="key_id-given-a-private-key"),
        pytest.param(key_id, lambda k: _ed25519_public_pem(), "public_key", id="key_id-not-ec"),
        pytest.param(public_key_of, lambda k: GARBAGE_PEM, "private_key", id="public_key_of-garbage"),
        pytest.param(public_key_of, lambda k: k.public_pem, "private_key", id="public_key_of-given-a-public-key"),
        pytest.param(public_key_of, lambda k: k.private_pem[:-40], "private_key", id="public_key_of-truncated"),
    ],
)
def test_a_key_that_is_not_an_ec_pem_is_refused_without_echoing_it(keys, call, pem_of, field):
    pem = pem_of(keys)
    with pytest.raises(InvalidInput) as caught:
        call(pem)
    err = caught.value
    assert (err.code, err.field) == (ErrorCode.SIGNATURE_INVALID, field)
    body = [line for line in pem.decode().splitlines() if line and not line.startswith("-----")]
    assert not any(line in str(err) or line in err.one_line() for line in body)


def test_signing_and_verifying_refuse_a_bad_key_without_echoing_it(bundle, signature, keys):
    with pytest.raises(InvalidInput) as signing:
        sign_directory(bundle, keys.public_pem)
    with pytest.raises(InvalidInput) as verifying:
        verify_directory(bundle, signature, keys.private_pem)
    assert (signing.value.field, verifying.value.field) == ("private_key", "public_key")
    for err in (signing.value, verifying.value):
        assert b"PRIVATE" not in str(err).encode() and keys.private_pem.decode()[40:80] not in str(err)
