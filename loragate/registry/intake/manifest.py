"""The adapter manifest: one typed schema, normalised and validated in one place.

The manifest travels next to the weights and binds them to one base model commit, one
config, one tokenizer and one quantization setup. Fields fall in three groups:

* submitted by training (rank, alpha, target modules, base id, ...), part of the identity;
  ``base_model_id``, ``base_model_commit``, ``lora_rank``, ``lora_alpha``,
  ``target_modules``, ``quantization_config`` (``null`` for full precision) and
  ``training_git_commit`` are required: the registry never guesses which base commit an
  adapter was trained on;
* filled or checked by the registry (``weights_sha256``, and the facts of the pinned base:
  ``base_config_sha256``, ``tokenizer_revision``, ``rope_scaling``), part of the identity
  once filled;
* owned by the registry's lifecycle (``adapter_version``, ``previous_version``,
  ``validation_*``, ``deployment_timestamp``, ``signing_key_id``), never part of the identity.

The identity hash is the canonical-JSON sha256 of the first two groups; together with the
weights digest it forms a version's content address.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    field_validator,
)

from loragate.registry.digests import (
    GIT_COMMIT,
    SHA256_HEX,
    canonical_json,
    canonical_sha256,
    digest_of_hex,
    is_revision,
    sha256_bytes,
)
from loragate.registry.errors import ErrorCode, InvalidInput
from loragate.registry.intake.jsonio import loads_object
from loragate.registry.rules.lifecycle import ValidationStatus

LIFECYCLE_FIELDS = (
    "adapter_version",
    "previous_version",
    "deployment_timestamp",
    "validation_status",
    "validation_report",
    "signing_key_id",
)
# why a required field may not be left out, for the error that names it
_REQUIRED_HINTS = {
    "base_model_commit": "the exact base commit the adapter was trained on (never inferred)",
    "quantization_config": "the bitsandbytes setup it was trained against, or null for full precision",
    "training_git_commit": "the commit of the training code (7-40 hex)",
}
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class QuantizationConfig(BaseModel):
    """The bitsandbytes 4-bit setup the adapter was trained against (QLoRA)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    load_in_4bit: StrictBool
    bnb_4bit_compute_dtype: Literal["float32", "float16", "bfloat16"]
    bnb_4bit_quant_type: Literal["nf4", "fp4"]
    bnb_4bit_use_double_quant: StrictBool


class Manifest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # lifecycle, owned by the registry
    adapter_version: StrictStr | None = None
    previous_version: StrictStr | None = None
    deployment_timestamp: StrictStr | None = None
    validation_status: ValidationStatus | None = None
    validation_report: dict[str, Any] | None = None
    signing_key_id: StrictStr | None = None

    # binding to the base model: id and commit required, the base's facts filled from the catalog
    base_model_id: StrictStr
    base_model_commit: StrictStr
    base_config_sha256: StrictStr | None = None
    tokenizer_revision: StrictStr | None = None
    rope_scaling: dict[str, Any] | None = None

    # the adapter itself
    adapter_checkpoint: StrictStr | None = None
    weights_sha256: StrictStr | None = None
    lora_rank: StrictInt = Field(ge=1)
    lora_alpha: StrictInt | StrictFloat = Field(gt=0)
    lora_dropout: StrictInt | StrictFloat = Field(default=0.0, ge=0, lt=1)
    target_modules: list[StrictStr] | StrictStr
    # required: null for full precision
    quantization_config: QuantizationConfig | None

    # provenance
    training_git_commit: StrictStr
    training_metadata: dict[str, Any] = Field(default_factory=dict)
    tested_on_models: list[StrictStr] = Field(default_factory=list)

    @field_validator("base_model_commit")
    @classmethod
    def _commit_format(cls, v: str) -> str:
        if not is_revision(v):
            raise ValueError("must be a 40-hex Hugging Face commit or a sha256:<hex> content digest")
        return v

    @field_validator("base_config_sha256", "weights_sha256")
    @classmethod
    def _hex64(cls, v: str | None) -> str | None:
        if v is not None and not SHA256_HEX.match(v):
            raise ValueError("must be 64 lower-case hex characters")
        return v

    @field_validator("tokenizer_revision")
    @classmethod
    def _tokenizer_revision(cls, v: str | None) -> str | None:
        if v is not None and not is_revision(v):
            raise ValueError("must be a sha256:<hex> digest of the tokenizer files or a 40-hex commit")
        return v

    @field_validator("training_git_commit")
    @classmethod
    def _git_commit(cls, v: str) -> str:
        if not GIT_COMMIT.match(v):
            raise ValueError("must be 7-40 lower-case hex characters")
        return v

    @field_validator("target_modules")
    @classmethod
    def _targets(cls, v: list[str] | str) -> list[str] | str:
        if isinstance(v, str):
            try:
                re.compile(v)
            except re.error as e:
                raise ValueError(f"is not a valid regular expression: {e}") from e
            return v
        if not v:
            raise ValueError("must name at least one module")
        bad = [m for m in v if not _MODULE.match(m)]
        if bad:
            raise ValueError(f"holds names that are not module names: {bad}")
        if len(set(v)) != len(v):
            raise ValueError("lists a module twice")
        return sorted(v)

    @field_validator("rope_scaling")
    @classmethod
    def _rope(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        return normalize_rope_scaling(v)

    def identity(self) -> dict[str, Any]:
        """The fields that define this adapter version's content."""
        return self.model_dump(mode="json", exclude=set(LIFECYCLE_FIELDS))

    def identity_sha256(self) -> str:
        return canonical_sha256(self.identity())

    def canonical_bytes(self) -> bytes:
        return canonical_json(self.model_dump(mode="json"))

    def lifecycle_fields_set(self) -> list[str]:
        return [f for f in LIFECYCLE_FIELDS if getattr(self, f) not in (None, ValidationStatus.PENDING)]


def normalize_rope_scaling(value: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Fold legacy and transformers-5 spellings of RoPE scaling into one form.

    ``rope_theta`` is left out (it lives in the config hash); plain RoPE is ``None``.
    """
    if value is None:
        return None
    rope = {("rope_type" if k == "type" else k): v for k, v in value.items() if k != "rope_theta"}
    if not rope or rope == {"rope_type": "default"}:
        return None
    return rope


def content_address(identity_sha256: str, weights_sha256: str, adapter_config_sha256: str) -> str:
    """The digest a version is known by: identity + weights + PEFT config bytes."""
    return digest_of_hex(
        sha256_bytes(
            canonical_json(
                {
                    "manifest": identity_sha256,
                    "weights": weights_sha256,
                    "adapter_config": adapter_config_sha256,
                }
            )
        )
    )


def parse_json_object(raw: bytes, *, what: str, code: ErrorCode, field: str) -> dict[str, Any]:
    """Strict JSON (see ``loragate.registry.intake.jsonio``): one object, UTF-8, no duplicate keys, no NaN.

    Raises:
        InvalidInput: with ``code`` and ``field``, naming what is wrong.
    """
    return loads_object(raw, what=what, code=code, field=field)


def parse_manifest(data: dict[str, Any]) -> Manifest:
    """The manifest, normalised and validated against the schema.

    Raises:
        InvalidInput: INVALID_MANIFEST naming the first field at fault (a missing
            required field, an unknown one, a malformed value).
    """
    try:
        return Manifest.model_validate(data)
    except ValidationError as e:
        raise _manifest_error(e) from e


def _manifest_error(e: ValidationError) -> InvalidInput:
    errors = e.errors()
    first = errors[0]
    field = ".".join(str(p) for p in first["loc"]) or None
    if first["type"] == "extra_forbidden":
        msg = f"manifest field {field!r} is not part of the schema"
    elif first["type"] == "missing":
        hint = _REQUIRED_HINTS.get(field or "")
        msg = f"manifest field {field!r} is required" + (f": {hint}" if hint else "")
    else:
        msg = f"manifest field {field!r}: {first['msg']}"
    if len(errors) > 1:
        msg += f" (and {len(errors) - 1} more problem(s))"
    return InvalidInput(msg, code=ErrorCode.INVALID_MANIFEST, field=field)
