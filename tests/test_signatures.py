"""Production serves signed bytes only: a signature by an active ``signing`` key over the
version's bundle and its latest (passed) validation report, verified when production moves
(promotion and rollback alike) and again on the copy a replica is given.

The primitive's own tamper suite is tests/test_signing.py; this one is the registry's rule.
"""

from __future__ import annotations

import shutil

import pytest

from loragate.registry.errors import ErrorCode, IllegalTransition, PermissionDenied, SignatureInvalid
from loragate.registry.storage.signing import generate_key_pair, key_id
from tests.support.moves import promote, rollback
from tests.support.registries import SIGNING_KEY, mark_validated, registry_snapshot, sign

NAME = "acme/tiny-llama/support"


@pytest.fixture
def canaried(cataloged, seeded_bundles):
    """v1 in production; v2 validated, signed and the canary; v3 validated, unsigned, staging."""
    registry, _ = cataloged
    v1, v2, v3 = (registry.register_adapter(b, NAME).version.version_id for b in seeded_bundles[:3])
    for v in (v1, v2):
        mark_validated(registry, v)
    promote(registry, v1, "canary")
    promote(registry, v1, "production")
    promote(registry, v2, "canary")
    mark_validated(registry, v3, signed=False)
    return registry, v1, v2, v3


def refused_without_change(registry, move, error=SignatureInvalid):
    before = registry_snapshot(registry.settings)
    with pytest.raises(error) as refused:
        move()
    assert registry_snapshot(registry.settings) == before
    return refused.value


def test_an_unsigned_version_cannot_reach_production(canaried):
    registry, v1, _, v3 = canaried
    promote(registry, v3, "canary")
    error = refused_without_change(registry, lambda: promote(registry, v3, "production"), IllegalTransition)
    assert error.code == ErrorCode.SIGNATURE_REQUIRED
    assert registry.get_adapter(NAME).production == v1


def test_a_signed_canary_reaches_production_and_the_signature_names_the_key(canaried):
    registry, _, v2, _ = canaried
    promote(registry, v2, "production")
    assert registry.verify_signature(v2).key_id == key_id(SIGNING_KEY.public_pem)


@pytest.mark.parametrize("part", ["adapter_model.safetensors", "adapter_config.json", "manifest.json"])
def test_one_changed_byte_in_the_copy_a_replica_is_given_is_refused_naming_the_part(canaried, tmp_path, part):
    registry, _, v2, _ = canaried
    copy = registry.materialize(v2, tmp_path / "served")
    registry.verify_signature(v2, bundle_dir=copy)
    data = bytearray((copy / part).read_bytes())
    data[len(data) // 2] ^= 0x01
    (copy / part).write_bytes(bytes(data))
    with pytest.raises(SignatureInvalid, match=part.replace(".", r"\.")):
        registry.verify_signature(v2, bundle_dir=copy)


def test_a_later_validation_run_makes_the_signature_stale(canaried):
    """The report is a signed part: re-validated, the version needs signing again."""
    registry, _, v2, _ = canaried
    mark_validated(registry, v2, signed=False)
    error = refused_without_change(registry, lambda: promote(registry, v2, "production"))
    assert "not the latest" in error.message
    sign(registry, v2)
    promote(registry, v2, "production")


def test_a_signature_made_over_another_version_is_refused(canaried):
    registry, v1, v2, v3 = canaried
    theirs = registry.signatures(v1)[0]
    run = registry.validation_runs(v3)[-1]
    # a row that claims v1's signature for v3 (only someone with database access could write it)
    registry._store.access.record_signature(
        v3, registry.get_version(v3).name, theirs.key_id, run.id, theirs.report_sha256, theirs.signature, "attacker"
    )
    promote(registry, v3, "canary")
    error = refused_without_change(registry, lambda: promote(registry, v3, "production"))
    assert "another version" in error.message


def test_a_revoked_key_no_longer_counts_for_promotion_nor_for_rollback(canaried):
    registry, v1, v2, _ = canaried
    promote(registry, v2, "production")  # v1 is previous
    registry.revoke_signing_key(key_id(SIGNING_KEY.public_pem))
    # rollback goes only to the recorded previous production, whose signature is re-verified
    error = refused_without_change(registry, lambda: rollback(registry, NAME, "production"))
    assert "unknown or revoked" in error.message
    assert registry.get_adapter(NAME).production == v2


@pytest.mark.parametrize("role", ["activation", "admin", "training"])
def test_a_key_registered_for_another_role_cannot_sign_for_production(canaried, role):
    registry, _, _, v3 = canaried
    other = generate_key_pair()
    registry.add_signing_key(other.public_pem, role, "someone")
    refused_without_change(registry, lambda: registry.sign_version(v3, other.private_pem), PermissionDenied)
    # and a signature such a key made anyway (written straight to the database) is refused
    signed = _sign_bypassing_checks(registry, v3, other.private_pem)
    promote(registry, v3, "canary")
    error = refused_without_change(registry, lambda: promote(registry, v3, "production"))
    assert f"a {role} key" in error.message and signed


def test_an_unknown_key_cannot_sign(canaried):
    registry, _, _, v3 = canaried
    error = refused_without_change(
        registry, lambda: registry.sign_version(v3, generate_key_pair().private_pem), PermissionDenied
    )
    assert "not registered" in error.message


def test_a_signature_by_one_key_recorded_under_another_is_refused(canaried):
    registry, _, _, v3 = canaried
    impostor = generate_key_pair()
    registry.add_signing_key(impostor.public_pem, "activation", "impostor")
    # bytes signed by the impostor, attributed to the real signing key
    _sign_bypassing_checks(registry, v3, impostor.private_pem, as_key=key_id(SIGNING_KEY.public_pem))
    promote(registry, v3, "canary")
    error = refused_without_change(registry, lambda: promote(registry, v3, "production"))
    assert "another key" in error.message or "altered" in error.message


def test_an_unvalidated_version_cannot_be_signed(cataloged, random_bundle):
    registry, _ = cataloged
    registry.add_signing_key(SIGNING_KEY.public_pem, "signing", "tests")
    version = registry.register_adapter(random_bundle, NAME).version.version_id
    error = refused_without_change(
        registry, lambda: registry.sign_version(version, SIGNING_KEY.private_pem), IllegalTransition
    )
    assert error.code == ErrorCode.VALIDATION_REQUIRED


def _sign_bypassing_checks(registry, version_id: str, private_pem: bytes, as_key: str | None = None) -> bool:
    """Sign the version's real signed parts with any key and store the row directly: what
    an attacker with database access could do."""
    import tempfile
    from pathlib import Path

    from loragate.registry.digests import sha256_file
    from loragate.registry.storage.signing import SIGNED_REPORT_FILE, public_key_of, sign_directory

    version = registry.get_version(version_id)
    run = registry.validation_runs(version_id)[-1]
    with tempfile.TemporaryDirectory() as tmp:
        signed = registry._signing_dir(version, run, Path(tmp), None)
        signature = sign_directory(signed, private_pem)
        report = sha256_file(signed / SIGNED_REPORT_FILE)
    kid = as_key or key_id(public_key_of(private_pem))
    registry._store.access.record_signature(
        version_id, registry.get_version(version_id).name, kid, run.id, report, signature, "attacker"
    )
    return True


def test_signing_and_verifying_leave_no_scratch_behind(canaried, tmp_path, monkeypatch):
    registry, _, v2, v3 = canaried
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    sign(registry, v3)
    registry.verify_signature(v2)
    assert list(scratch.iterdir()) == []
    shutil.rmtree(scratch)
