"""Manifest schema, canonical JSON and content addressing."""

from __future__ import annotations

import json

import pytest

from loragate.registry.digests import canonical_json
from loragate.registry.errors import ErrorCode, InvalidInput
from loragate.registry.intake.manifest import content_address, parse_json_object, parse_manifest

BASE = {
    "base_model_id": "tiny-llama",
    "base_model_commit": "sha256:" + "a" * 64,
    "lora_rank": 8,
    "lora_alpha": 16,
    "target_modules": ["v_proj", "q_proj"],
    "quantization_config": None,
    "training_git_commit": "0123456",
}
REQUIRED = (
    "base_model_id",
    "base_model_commit",
    "lora_rank",
    "lora_alpha",
    "target_modules",
    "quantization_config",
    "training_git_commit",
)


@pytest.mark.parametrize("field", REQUIRED)
def test_a_manifest_missing_a_required_field_is_refused_naming_it(field):
    with pytest.raises(InvalidInput) as err:
        parse_manifest({k: v for k, v in BASE.items() if k != field})
    assert (err.value.code, err.value.field) == (ErrorCode.INVALID_MANIFEST, field)
    assert f"manifest field {field!r} is required" in err.value.message


def test_required_fields_are_exactly_the_seed_list_plus_the_base_id():
    from loragate.registry.intake.manifest import Manifest

    required = {name for name, info in Manifest.model_fields.items() if info.is_required()}
    assert required == set(REQUIRED)


def test_full_precision_is_an_explicit_null_quantization_config():
    assert parse_manifest(BASE).quantization_config is None


@pytest.mark.parametrize("commit", ["0123456", "0123456789abcdef0123456789abcdef01234567"])
def test_training_git_commit_takes_7_to_40_hex(commit):
    assert parse_manifest({**BASE, "training_git_commit": commit}).training_git_commit == commit


def test_identity_hash_ignores_key_order_whitespace_and_integral_float_spelling():
    a = parse_manifest(BASE)
    b = parse_manifest(json.loads(json.dumps(dict(reversed(list({**BASE, "lora_alpha": 16.0}.items()))), indent=4)))
    assert a.identity_sha256() == b.identity_sha256()


def test_identity_hash_ignores_lifecycle_fields_but_not_content():
    a = parse_manifest(BASE)
    assert (
        parse_manifest({**BASE, "adapter_version": "x", "validation_status": "passed"}).identity_sha256()
        == a.identity_sha256()
    )
    assert parse_manifest({**BASE, "lora_alpha": 32}).identity_sha256() != a.identity_sha256()


def test_target_modules_are_normalised_sorted():
    assert parse_manifest(BASE).target_modules == ["q_proj", "v_proj"]


def test_content_address_depends_on_each_part():
    base = content_address("a" * 64, "b" * 64, "c" * 64)
    assert base.startswith("sha256:")
    assert (
        len(
            {
                base,
                content_address("x" * 64, "b" * 64, "c" * 64),
                content_address("a" * 64, "x" * 64, "c" * 64),
                content_address("a" * 64, "b" * 64, "x" * 64),
            }
        )
        == 4
    )


def test_canonical_json_refuses_nan():
    with pytest.raises(ValueError):
        canonical_json({"x": float("nan")})


@pytest.mark.parametrize(
    "patch, field",
    [
        ({"lora_rank": 0}, "lora_rank"),
        ({"lora_rank": True}, "lora_rank"),
        ({"lora_dropout": 1.0}, "lora_dropout"),
        ({"target_modules": []}, "target_modules"),
        ({"target_modules": ["q_proj", "q_proj"]}, "target_modules"),
        ({"target_modules": ["q proj"]}, "target_modules"),
        ({"target_modules": "(unclosed"}, "target_modules"),
        ({"training_git_commit": "HEAD"}, "training_git_commit"),
        ({"training_git_commit": "012345"}, "training_git_commit"),
        ({"training_git_commit": "0" * 41}, "training_git_commit"),
        ({"base_model_commit": "main"}, "base_model_commit"),
        ({"weights_sha256": "ABC"}, "weights_sha256"),
        ({"tokenizer_revision": "v1"}, "tokenizer_revision"),
        ({"quantization_config": {"load_in_4bit": True}}, "quantization_config.bnb_4bit_compute_dtype"),
    ],
)
def test_schema_errors_name_the_field(patch, field):
    with pytest.raises(InvalidInput) as err:
        parse_manifest({**BASE, **patch})
    assert err.value.code == ErrorCode.INVALID_MANIFEST
    assert err.value.field == field


@pytest.mark.parametrize("raw", [b'{"a": 1, "a": 2}', b"[1]", b"\xff", b'{"a": NaN}'])
def test_strict_json_refuses_duplicates_arrays_bad_utf8_and_nan(raw):
    with pytest.raises(InvalidInput):
        parse_json_object(raw, what="x", code=ErrorCode.INVALID_MANIFEST, field="x")
