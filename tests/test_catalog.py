"""The base-model catalog: pins, canonical config hashing, the hub cache, drift."""

from __future__ import annotations

import json
import shutil

import pytest

from loragate.registry.digests import canonical_sha256
from loragate.registry.errors import ErrorCode, IntegrityFailure, InvalidInput
from loragate.registry.intake.catalog import canonical_config, config_facts, inspect_base, verify_base

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def test_building_the_base_twice_gives_the_same_commit(tiny_base, tmp_path):
    from kit.basekit import build_base

    again = build_base(tmp_path / "again")
    assert (
        inspect_base(str(again), "tiny-llama").base_model_commit
        == inspect_base(str(tiny_base), "tiny-llama").base_model_commit
    )


def test_local_base_is_pinned_by_content_digest_with_shapes_and_tokenizer(tiny_base):
    record = inspect_base(str(tiny_base), "tiny-llama")
    assert record.source_kind == "local"
    assert record.base_model_commit.startswith("sha256:") and record.base_model_commit == record.content_digest
    assert record.tokenizer_revision.startswith("sha256:")
    assert record.rope_scaling is None
    assert record.module_shapes["model.layers.0.self_attn.q_proj.weight"] == [128, 128]
    assert record.module_shapes["model.layers.1.mlp.down_proj.weight"] == [128, 256]


def test_rope_variant_has_other_commit_config_hash_and_rope(tiny_base, tmp_path):
    from kit.basekit import build_base

    variant = build_base(tmp_path / "rope", rope_scaling={"rope_type": "linear", "factor": 2.0})
    a, b = inspect_base(str(tiny_base), "tiny-llama"), inspect_base(str(variant), "tiny-llama")
    assert a.base_model_commit != b.base_model_commit
    assert a.config_sha256 != b.config_sha256
    assert b.rope_scaling == {"rope_type": "linear", "factor": 2.0}
    assert a.tokenizer_revision == b.tokenizer_revision


def test_config_hash_ignores_volatile_keys_and_legacy_rope_spelling(tiny_base):
    raw = json.loads((tiny_base / "config.json").read_text())
    noisy = {
        **raw,
        "transformers_version": "4.99.0",
        "_name_or_path": "/elsewhere",
        "use_cache": False,
        "torch_dtype": "bfloat16",
        "output_hidden_states": True,
        "_attn_implementation": "sdpa",
    }
    legacy = {k: v for k, v in raw.items() if k != "rope_parameters"}
    legacy["rope_theta"] = raw["rope_parameters"]["rope_theta"]
    legacy["rope_scaling"] = None
    h = canonical_sha256(canonical_config(raw))
    assert canonical_sha256(canonical_config(noisy)) == h
    assert canonical_sha256(canonical_config(legacy)) == h
    assert canonical_sha256(canonical_config({**raw, "num_hidden_layers": 3})) != h


def test_legacy_rope_scaling_type_key_is_normalised():
    facts = config_facts(json.dumps({"rope_scaling": {"type": "linear", "factor": 4.0}, "rope_theta": 5e5}).encode())
    assert facts["rope_scaling"] == {"rope_type": "linear", "factor": 4.0}


def test_hub_base_resolves_from_the_local_cache_only(tiny_base, tmp_path):
    from kit.basekit import write_hf_cache

    hub = str(tmp_path / "hub")
    write_hf_cache(tiny_base, tmp_path / "hub", "acme/tiny-llama", COMMIT)
    record = inspect_base("acme/tiny-llama", "tiny-llama", revision=COMMIT, cache_dir=hub)
    assert (record.source_kind, record.source, record.base_model_commit) == ("hf", "acme/tiny-llama", COMMIT)
    assert record.content_digest == inspect_base(str(tiny_base), "tiny-llama").content_digest
    assert verify_base(record, hub).name == COMMIT


@pytest.mark.parametrize(
    "source, revision, field",
    [
        ("acme/tiny-llama", None, "revision"),
        ("acme/tiny-llama", "main", "revision"),
        ("acme/not-cached", COMMIT, "revision"),
        ("/no/such/dir", None, "source"),
    ],
)
def test_unpinned_or_uncached_hub_bases_are_refused(tmp_path, source, revision, field):
    with pytest.raises(InvalidInput) as err:
        inspect_base(source, "tiny-llama", revision=revision, cache_dir=str(tmp_path / "hub"))
    assert err.value.field == field


def test_base_add_is_idempotent_and_a_second_commit_is_a_second_pin(cataloged, tmp_path):
    from kit.basekit import build_base

    registry, record = cataloged
    again, created = registry.add_base(record.source, "tiny-llama")
    assert not created and again.base_model_commit == record.base_model_commit
    variant = build_base(tmp_path / "rope", rope_scaling={"rope_type": "linear", "factor": 2.0})
    _, created = registry.add_base(str(variant), "tiny-llama")
    assert created and len(registry.list_bases("tiny-llama")) == 2


def test_a_manifest_binds_to_the_commit_it_names_and_gets_that_commits_facts(cataloged, tmp_path, random_bundle):
    from kit import corpus
    from kit.basekit import build_base

    registry, pinned = cataloged
    variant, _ = registry.add_base(
        str(build_base(tmp_path / "rope", rope_scaling={"rope_type": "linear", "factor": 2.0})), "tiny-llama"
    )
    on_variant = corpus.bound_to(random_bundle, tmp_path / "on-variant", base_model_commit=variant.base_model_commit)
    first = registry.register_adapter(random_bundle, "acme/tiny-llama/support").version
    second = registry.register_adapter(on_variant, "acme/tiny-llama/support").version
    assert (first.base_model_commit, first.manifest["base_config_sha256"]) == (
        pinned.base_model_commit,
        pinned.config_sha256,
    )
    assert (second.base_model_commit, second.manifest["rope_scaling"]) == (
        variant.base_model_commit,
        {"rope_type": "linear", "factor": 2.0},
    )


def test_a_manifest_without_a_commit_is_refused_even_when_one_commit_is_pinned(cataloged, tmp_path, random_bundle):
    """Inferring the commit would bind an adapter trained on an unpinned commit silently."""
    from kit import corpus

    registry, _ = cataloged
    bundle = corpus.copy_bundle(random_bundle, tmp_path / "no-commit")
    manifest = json.loads((bundle / "manifest.json").read_text())
    del manifest["base_model_commit"]
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(InvalidInput) as err:
        registry.register_adapter(bundle, "acme/tiny-llama/support")
    assert (err.value.code, err.value.field) == (ErrorCode.INVALID_MANIFEST, "base_model_commit")
    assert registry.list_versions() == []


@pytest.mark.parametrize(
    "tamper, field",
    [
        (
            lambda d: (d / "config.json").write_text(
                json.dumps(
                    {
                        **json.loads((d / "config.json").read_text()),
                        "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},
                    }
                )
            ),
            "base_config_sha256",
        ),
        (
            lambda d: (d / "tokenizer.json").write_text(
                (d / "tokenizer.json").read_text().replace('"<pad>"', '"<PAD>"')
            ),
            "tokenizer_revision",
        ),
        (
            lambda d: (d / "model.safetensors").write_bytes((d / "model.safetensors").read_bytes()[:-4] + b"\0\0\0\0"),
            "base_model_commit",
        ),
        (lambda d: shutil.rmtree(d), "base_model_commit"),
    ],
    ids=["rope-changed-in-place", "tokenizer-changed", "weights-changed", "base-deleted"],
)
def test_verify_base_makes_silent_base_updates_loud(tiny_base, tmp_path, tamper, field):
    copy = tmp_path / "base"
    shutil.copytree(tiny_base, copy)
    record = inspect_base(str(copy), "tiny-llama")
    tamper(copy)
    with pytest.raises(IntegrityFailure) as err:
        verify_base(record)
    assert err.value.code == ErrorCode.BASE_DRIFT and err.value.field == field
