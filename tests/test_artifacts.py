"""Content-addressed artifact store: local directory and S3 over HTTP (moto server)."""

from __future__ import annotations

import os

import boto3
import pytest

from loragate.registry.digests import digest_of_hex, sha256_bytes, sha256_file
from loragate.registry.errors import AlreadyExists, ErrorCode, IntegrityFailure
from loragate.registry.service import Registry
from loragate.registry.storage.blobs import blob_key
from loragate.registry.storage.local_store import LocalArtifactStore
from loragate.registry.storage.s3_store import S3ArtifactStore
from tests.support.registries import IN_PROCESS, artifact_store

NAME = "acme/tiny-llama/support"


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path):
    if request.param == "local":
        s = LocalArtifactStore(tmp_path / "blobs")
    else:
        endpoint = request.getfixturevalue("s3_endpoint")
        location = request.getfixturevalue("s3_location")
        bucket, prefix = location[len("s3://") :].split("/", 1)
        s = S3ArtifactStore(bucket, prefix, endpoint_url=endpoint, multipart_threshold=5 << 20)
    s.ensure()
    return s


def _corrupt(store, digest: str) -> None:
    if isinstance(store, LocalArtifactStore):
        path = store.root / blob_key(digest)
        os.chmod(path, 0o644)
        path.write_bytes(b"tampered")
    else:
        store.client.put_object(Bucket=store.bucket, Key=store._key(digest), Body=b"tampered")


def test_put_is_keyed_by_digest_and_a_repeat_writes_nothing(store):
    data = b"adapter bytes"
    digest = digest_of_hex(sha256_bytes(data))
    assert not store.exists(digest)
    assert store.put_bytes(digest, data) is True
    assert store.exists(digest)
    assert store.put_bytes(digest, data) is False
    assert store.read_bytes(digest) == data


def test_put_refuses_bytes_that_do_not_match_their_key(store):
    digest = digest_of_hex(sha256_bytes(b"one thing"))
    with pytest.raises(IntegrityFailure):
        store.put_bytes(digest, b"another thing")
    assert not store.exists(digest)


def test_every_read_verifies_the_digest(store, tmp_path):
    data = b"golden bytes"
    digest = digest_of_hex(sha256_bytes(data))
    store.put_bytes(digest, data)
    _corrupt(store, digest)
    with pytest.raises(IntegrityFailure) as err:
        store.fetch_to(digest, tmp_path / "out")
    assert err.value.code == ErrorCode.ARTIFACT_CORRUPTED


def test_missing_blob_is_an_integrity_failure(store, tmp_path):
    with pytest.raises(IntegrityFailure):
        store.fetch_to(digest_of_hex("0" * 64), tmp_path / "out")


def test_large_file_round_trips_through_multipart(store, tmp_path):
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(12 << 20))
    digest = digest_of_hex(sha256_file(big))
    assert store.put_file(digest, big)
    store.fetch_to(digest, tmp_path / "back.bin")
    assert sha256_file(tmp_path / "back.bin") == sha256_file(big)


def test_s3_large_upload_is_really_multipart(s3_endpoint, s3_location, tmp_path):
    bucket, prefix = s3_location[len("s3://") :].split("/", 1)
    store = S3ArtifactStore(bucket, prefix, endpoint_url=s3_endpoint, multipart_threshold=5 << 20)
    store.ensure()
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(11 << 20))
    digest = digest_of_hex(sha256_file(big))
    store.put_file(digest, big)
    head = boto3.client("s3", endpoint_url=s3_endpoint).head_object(Bucket=bucket, Key=store._key(digest))
    assert "-" in head["ETag"]  # multipart ETags are "<md5 of md5s>-<parts>"


@pytest.fixture
def s3_registry(tmp_path, s3_endpoint, s3_location, tiny_base):
    from loragate.registry.settings import Settings

    settings = Settings(
        home=tmp_path,
        database_url=f"sqlite:///{tmp_path / 'r.db'}",
        artifacts=s3_location,
        s3_endpoint_url=s3_endpoint,
        actor="tester",
    )
    reg = Registry.open(settings, check_schema=False, principal=IN_PROCESS)
    reg.init()
    reg.add_base(str(tiny_base), "tiny-llama")
    return reg


def _objects(reg) -> dict[str, str]:
    store = artifact_store(reg)
    pages = store.client.get_paginator("list_objects_v2").paginate(Bucket=store.bucket)
    return {o["Key"]: o["ETag"] + str(o["LastModified"]) for p in pages for o in p.get("Contents", [])}


def test_register_on_s3_stores_the_bundle_and_a_repeat_uploads_nothing(s3_registry, random_bundle):
    first = s3_registry.register_adapter(random_bundle, NAME)
    assert first.uploaded_blobs == 3
    objects = _objects(s3_registry)
    assert len(objects) == 3
    second = s3_registry.register_adapter(random_bundle, NAME)
    assert second.uploaded_blobs == 0 and not second.created
    assert _objects(s3_registry) == objects


def test_materialize_from_s3_writes_the_exact_bundle(s3_registry, random_bundle, tmp_path):
    v = s3_registry.register_adapter(random_bundle, NAME).version
    dest = s3_registry.materialize(v.version_id, tmp_path / "served" / v.version_id)
    assert sha256_file(dest / "adapter_model.safetensors") == v.weights_sha256
    assert sha256_file(dest / "adapter_config.json") == sha256_file(random_bundle / "adapter_config.json")
    assert sorted(p.name for p in dest.iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
        "manifest.json",
    ]


def test_materialize_is_idempotent_and_leaves_no_temp_dirs(cataloged, random_bundle, tmp_path):
    registry, _ = cataloged
    v = registry.register_adapter(random_bundle, NAME).version
    dest = tmp_path / "served" / v.version_id
    registry.materialize(v.version_id, dest)
    mtime = (dest / "adapter_model.safetensors").stat().st_mtime_ns
    registry.materialize(v.version_id, dest)
    assert (dest / "adapter_model.safetensors").stat().st_mtime_ns == mtime
    assert [p.name for p in dest.parent.iterdir()] == [v.version_id]


def test_materialize_refuses_to_overwrite_other_content(cataloged, random_bundle, tmp_path):
    registry, _ = cataloged
    v = registry.register_adapter(random_bundle, NAME).version
    dest = tmp_path / "served"
    dest.mkdir()
    (dest / "adapter_model.safetensors").write_bytes(b"someone else's")
    with pytest.raises(AlreadyExists):
        registry.materialize(v.version_id, dest)
    assert (dest / "adapter_model.safetensors").read_bytes() == b"someone else's"


def test_materialize_of_a_corrupted_blob_fails_and_writes_no_bundle(cataloged, random_bundle, tmp_path):
    registry, _ = cataloged
    v = registry.register_adapter(random_bundle, NAME).version
    _corrupt(artifact_store(registry), digest_of_hex(v.weights_sha256))
    dest = tmp_path / "served" / v.version_id
    with pytest.raises(IntegrityFailure):
        registry.materialize(v.version_id, dest)
    assert not dest.exists()
    assert list((tmp_path / "served").iterdir()) == []
