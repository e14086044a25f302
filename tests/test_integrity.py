"""Stored bytes are never trusted for already being there.

On a local directory and on S3 over HTTP (moto server), on SQLite and on Postgres: a
register heals a damaged or lost blob it has the bytes for, and no pointer ever moves to
a version whose blobs are missing or damaged.
"""

from __future__ import annotations

import base64
import hashlib
import io
import os

import pytest

from loragate.registry.digests import digest_of_hex, sha256_bytes
from loragate.registry.errors import ErrorCode, IntegrityFailure
from loragate.registry.service import Registry
from loragate.registry.settings import Settings
from loragate.registry.storage.blobs import blob_key
from loragate.registry.storage.local_store import LocalArtifactStore
from loragate.registry.storage.s3_store import S3ArtifactStore
from tests.support.moves import promote, rollback
from tests.support.registries import IN_PROCESS, artifact_store, audit_count, mark_validated

NAME = "acme/tiny-llama/support"


@pytest.fixture(params=["local", "s3"])
def stored(request, tmp_path, db_url, tiny_base):
    s3 = request.param == "s3"
    settings = Settings(
        home=tmp_path / "home",
        database_url=db_url,
        artifacts=request.getfixturevalue("s3_location") if s3 else str(tmp_path / "artifacts"),
        s3_endpoint_url=request.getfixturevalue("s3_endpoint") if s3 else None,
        actor="tester",
    )
    registry = Registry.open(settings, check_schema=False, principal=IN_PROCESS)
    registry.init()
    registry.add_base(str(tiny_base), "tiny-llama")
    yield registry
    registry.close()


def damage(registry, hexdigest: str) -> None:
    store = artifact_store(registry)
    digest = digest_of_hex(hexdigest)
    if isinstance(store, LocalArtifactStore):
        path = store.root / blob_key(digest)
        os.chmod(path, 0o644)
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x01  # one flipped bit
        path.write_bytes(bytes(data))
    else:
        body = bytearray(store.client.get_object(Bucket=store.bucket, Key=store._key(digest))["Body"].read())
        body[len(body) // 2] ^= 0x01
        store.client.put_object(Bucket=store.bucket, Key=store._key(digest), Body=bytes(body))


def lose(registry, hexdigest: str) -> None:
    artifact_store(registry).delete(digest_of_hex(hexdigest))


def test_a_damaged_blob_is_rewritten_by_the_next_register_that_shares_it(stored, random_bundle, tmp_path):
    first = stored.register_adapter(random_bundle, NAME).version
    damage(stored, first.weights_sha256)
    with pytest.raises(IntegrityFailure):
        stored.verify_blobs(first.version_id)

    shared = stored.register_adapter(random_bundle, "other/tiny-llama/support")  # same weights, other manifest
    assert shared.created and shared.uploaded_blobs == 2  # the damaged weights and its own manifest
    for version in (first, shared.version):
        stored.verify_blobs(version.version_id)
        stored.materialize(version.version_id, tmp_path / "served" / version.version_id)


def test_a_lost_blob_is_restored_by_registering_the_same_bytes_again(stored, random_bundle):
    version = stored.register_adapter(random_bundle, NAME).version
    lose(stored, version.weights_sha256)
    lose(stored, version.manifest_sha256)
    again = stored.register_adapter(random_bundle, NAME)
    assert (again.created, again.version.version_id, again.uploaded_blobs) == (False, version.version_id, 2)
    stored.verify_blobs(version.version_id)


def test_registering_the_same_healthy_bytes_again_writes_nothing(stored, random_bundle):
    stored.register_adapter(random_bundle, NAME)
    assert stored.register_adapter(random_bundle, NAME).uploaded_blobs == 0


@pytest.mark.parametrize("spoil", [damage, lose], ids=["damaged", "lost"])
@pytest.mark.parametrize("which", ["weights_sha256", "adapter_config_sha256", "manifest_sha256"])
def test_a_pointer_never_moves_to_a_version_with_bad_blobs(stored, seeded_bundles, spoil, which):
    v1 = stored.register_adapter(seeded_bundles[0], NAME).version
    v2 = stored.register_adapter(seeded_bundles[1], NAME).version
    for v in (v1, v2):
        mark_validated(stored, v.version_id)
    promote(stored, v1.version_id, "canary")
    spoil(stored, getattr(v1, which))
    if getattr(v2, which) != getattr(v1, which):  # the seeded bundles share their adapter_config
        spoil(stored, getattr(v2, which))
    before = (stored.get_adapter(NAME), audit_count(stored))
    with pytest.raises(IntegrityFailure) as err:
        promote(stored, v1.version_id, "production")
    assert err.value.code == ErrorCode.ARTIFACT_CORRUPTED
    with pytest.raises(IntegrityFailure):
        promote(stored, v2.version_id, "canary")
    assert (stored.get_adapter(NAME), audit_count(stored)) == before


def test_rollback_refuses_to_restore_a_damaged_previous_version(stored, seeded_bundles):
    v1, v2 = (stored.register_adapter(b, NAME).version for b in seeded_bundles[:2])
    for v in (v1, v2):
        mark_validated(stored, v.version_id)
        promote(stored, v.version_id, "canary")
        promote(stored, v.version_id, "production")
    damage(stored, v1.weights_sha256)
    with pytest.raises(IntegrityFailure):
        rollback(stored, NAME)
    assert (stored.get_adapter(NAME).production, stored.get_adapter(NAME).previous) == (v2.version_id, v1.version_id)


# -- S3: the store's own checksums ------------------------------------------------------


@pytest.fixture
def s3(s3_endpoint, s3_location):
    bucket, prefix = s3_location[len("s3://") :].split("/", 1)
    store = S3ArtifactStore(bucket, prefix, endpoint_url=s3_endpoint, multipart_threshold=5 << 20)
    store.ensure()
    return store


def test_every_s3_upload_carries_its_sha256_checksum(s3, tmp_path):
    small = b"small blob"
    big = tmp_path / "big"
    big.write_bytes(os.urandom(11 << 20))
    for digest, put in (
        (digest_of_hex(sha256_bytes(small)), lambda d: s3.put_bytes(d, small)),
        (digest_of_hex(sha256_bytes(big.read_bytes())), lambda d: s3.put_file(d, big)),
    ):
        assert put(digest)
        head = s3.client.head_object(Bucket=s3.bucket, Key=s3._key(digest), ChecksumMode="ENABLED")
        assert head.get("ChecksumSHA256")
        s3.verify(digest)
        assert put(digest) is False  # verified by its checksum on reuse: nothing uploaded


def test_an_s3_object_overwritten_outside_loragate_fails_verification(s3):
    data = b"the real bytes"
    digest = digest_of_hex(sha256_bytes(data))
    s3.put_bytes(digest, data)
    s3.client.put_object(Bucket=s3.bucket, Key=s3._key(digest), Body=b"the real bytes")  # same bytes, no checksum
    with pytest.raises(IntegrityFailure, match="does not carry its SHA-256 checksum"):
        s3.verify(digest)
    assert s3.put_bytes(digest, data) is True  # a register with the bytes in hand rewrites it
    s3.verify(digest)


def test_a_multipart_blob_tampered_on_s3_fails_verification(s3, tmp_path):
    big = tmp_path / "big"
    big.write_bytes(os.urandom(11 << 20))
    digest = digest_of_hex(sha256_bytes(big.read_bytes()))
    s3.put_file(digest, big)
    s3.verify(digest)  # the composite checksum covers parts, so the bytes are read and hashed
    upload = s3.client.create_multipart_upload(Bucket=s3.bucket, Key=s3._key(digest), ChecksumAlgorithm="SHA256")
    parts = []
    for number in (1, 2):
        body = os.urandom(6 << 20)
        raw = hashlib.sha256(body).digest()
        answer = s3.client.upload_part(
            Bucket=s3.bucket,
            Key=s3._key(digest),
            UploadId=upload["UploadId"],
            PartNumber=number,
            Body=body,
            ChecksumAlgorithm="SHA256",
            ChecksumSHA256=base64.b64encode(raw).decode(),
        )
        parts.append({"ETag": answer["ETag"], "PartNumber": number, "ChecksumSHA256": base64.b64encode(raw).decode()})
    s3.client.complete_multipart_upload(
        Bucket=s3.bucket, Key=s3._key(digest), UploadId=upload["UploadId"], MultipartUpload={"Parts": parts}
    )
    with pytest.raises(IntegrityFailure, match="corrupted"):
        s3.verify(digest)


def test_a_failed_multipart_upload_is_aborted_and_leaves_nothing(s3):
    claimed = digest_of_hex(sha256_bytes(b"what the caller claims"))
    with pytest.raises(IntegrityFailure):
        s3._multipart(claimed, io.BytesIO(os.urandom(11 << 20)))  # bytes that are not the blob
    assert s3.client.list_multipart_uploads(Bucket=s3.bucket).get("Uploads", []) == []
    assert not s3.exists(claimed)


def test_gc_aborts_only_this_stores_unfinished_uploads_not_others_in_the_same_bucket(s3):
    mine = s3.client.create_multipart_upload(Bucket=s3.bucket, Key=s3._key(digest_of_hex("ab" * 32)))["UploadId"]
    theirs = {
        key: s3.client.create_multipart_upload(Bucket=s3.bucket, Key=key)["UploadId"]
        for key in ("other-team/blobs/sha256/" + "cd" * 32, "backups/db.dump", f"{s3.prefix}-other/blobs/x")
    }
    found = s3.litter(max_age_s=-1)
    assert [item.path.name for item in found] == [mine]
    s3.remove_litter(found)
    left = {u["Key"]: u["UploadId"] for u in s3.client.list_multipart_uploads(Bucket=s3.bucket).get("Uploads", [])}
    assert left == theirs, "uploads outside the store's prefix are untouched"
    for key, upload_id in theirs.items():
        s3.client.abort_multipart_upload(Bucket=s3.bucket, Key=key, UploadId=upload_id)
