"""The base-model catalog: what "the exact base model" means.

A base is pinned either as a Hugging Face id + commit (resolved from the local hub cache;
nothing is downloaded) or as a local directory whose commit *is* its content digest. For
both, the catalog records the content digest of every file, a canonical hash of the
config with volatile keys removed, the raw ``config.json`` digest, the RoPE settings, a
digest of the tokenizer files and the shape of every 2-D weight, which is how an adapter
whose layer names or shapes do not fit is refused before it is stored.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from loragate.registry.digests import (
    HF_COMMIT,
    canonical_json,
    canonical_sha256,
    digest_of_hex,
    sha256_bytes,
    sha256_file,
)
from loragate.registry.errors import ErrorCode, IntegrityFailure, InvalidInput
from loragate.registry.intake.jsonio import loads_object
from loragate.registry.intake.manifest import normalize_rope_scaling
from loragate.registry.intake.weights import read_base_linear_shapes
from loragate.registry.records.bases import BaseModelRecord
from loragate.registry.rules.names import check_base_id

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "added_tokens.json",
    "chat_template.jinja",
)
# keys that change with the tool that wrote config.json, not with the model
_VOLATILE_KEYS = {
    "_name_or_path",
    "transformers_version",
    "dtype",
    "torch_dtype",
    "use_cache",
    "return_dict",
    "quantization_config",
    "_commit_hash",
    "attn_implementation",
    "_attn_implementation",
    "_attn_implementation_autoset",
    "_attn_implementation_internal",
}
_HF_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")


def canonical_config(config: dict[str, Any]) -> dict[str, Any]:
    """The model-defining part of config.json, in one spelling whatever wrote it."""

    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in _VOLATILE_KEYS and not k.startswith("output_")}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    cfg = strip(dict(config))
    # transformers 5 folds rope_scaling + rope_theta into rope_parameters; older files
    # carry the legacy keys. Hash one form so both spellings of the same model agree.
    if "rope_parameters" in cfg or "rope_scaling" in cfg or "rope_theta" in cfg:
        rope = dict(cfg.pop("rope_parameters", None) or cfg.pop("rope_scaling", None) or {})
        cfg.pop("rope_scaling", None)
        if "type" in rope:
            rope["rope_type"] = rope.pop("type")
        rope.setdefault("rope_type", "default")
        if "rope_theta" in cfg:
            rope.setdefault("rope_theta", cfg.pop("rope_theta"))
        cfg["rope_parameters"] = rope
    return cfg


def config_facts(config_raw: bytes) -> dict[str, Any]:
    """Raises:
    InvalidInput: INVALID_BASE when config.json is not a JSON object.
    """
    config = loads_object(config_raw, what="config.json", code=ErrorCode.INVALID_BASE, field="config.json")
    canon = canonical_config(config)
    archs = config.get("architectures") or [None]
    return {
        "config_sha256": canonical_sha256(canon),
        "config_raw_sha256": sha256_bytes(config_raw),
        "rope_scaling": normalize_rope_scaling(canon.get("rope_parameters")),
        "transformers_version": config.get("transformers_version"),
        "architecture": archs[0],
    }


def _files(directory: Path) -> list[tuple[str, Path]]:
    out = []
    for dirpath, dirnames, filenames in os.walk(directory, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in filenames:
            if name.startswith("."):
                continue
            p = Path(dirpath) / name
            out.append((p.relative_to(directory).as_posix(), p))
    return sorted(out)


def directory_digest(directory: Path) -> str:
    """Content digest of a directory: canonical POSIX paths, sizes and file digests."""
    entries = [[rel, p.stat().st_size, sha256_file(p)] for rel, p in _files(directory)]
    return digest_of_hex(sha256_bytes(canonical_json(entries)))


def tokenizer_digest(directory: Path) -> str:
    """Raises:
    InvalidInput: INVALID_BASE when the directory holds no tokenizer files.
    """
    entries = [[name, sha256_file(directory / name)] for name in TOKENIZER_FILES if (directory / name).is_file()]
    if not entries:
        raise InvalidInput(f"no tokenizer files in {str(directory)!r}", code=ErrorCode.INVALID_BASE, field="tokenizer")
    return digest_of_hex(sha256_bytes(canonical_json(entries)))


def resolve_hf_snapshot(repo_id: str, revision: str, cache_dir: str | None = None) -> Path:
    """The local hub-cache snapshot of ``repo_id`` at ``revision``; never downloads.

    Raises:
        InvalidInput: INVALID_BASE when the snapshot is not in the local cache.
    """
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id, revision=revision, local_files_only=True, cache_dir=cache_dir))
    except (LocalEntryNotFoundError, FileNotFoundError, OSError) as e:
        raise InvalidInput(
            f"{repo_id}@{revision} is not in the local Hugging Face cache (HF_HOME); "
            f"loragate never downloads: {type(e).__name__}",
            code=ErrorCode.INVALID_BASE,
            field="revision",
        ) from e


def inspect_base(
    source: str, base_model_id: str, revision: str | None = None, cache_dir: str | None = None
) -> BaseModelRecord:
    """Pin a base: a local directory (commit = content digest) or a cached hub id + commit.

    Raises:
        InvalidInput: INVALID_BASE / INVALID_NAME for a source, revision or id that cannot be
        pinned, or a directory that is not a model.
    """
    check_base_id(base_model_id, field="id")
    path = Path(source)
    if path.is_dir():
        if revision is not None:
            raise InvalidInput(
                "--revision applies to Hugging Face ids; a local directory is pinned by its content digest",
                code=ErrorCode.INVALID_BASE,
                field="revision",
            )
        directory, kind, src = path.resolve(), "local", str(path.resolve())
    else:
        if not _HF_ID.match(source) or source.startswith(("/", ".")):
            raise InvalidInput(
                f"{source!r} is neither a directory nor a Hugging Face id", code=ErrorCode.INVALID_BASE, field="source"
            )
        if revision is None or not HF_COMMIT.match(revision):
            raise InvalidInput(
                "a Hugging Face base must be pinned with --revision <40-hex commit>",
                code=ErrorCode.INVALID_BASE,
                field="revision",
            )
        directory, kind, src = resolve_hf_snapshot(source, revision, cache_dir), "hf", source
    facts = base_directory_facts(directory)
    commit = facts["content_digest"] if kind == "local" else str(revision)
    return BaseModelRecord(base_model_id=base_model_id, base_model_commit=commit, source_kind=kind, source=src, **facts)


def base_directory_facts(directory: Path) -> dict[str, Any]:
    """Raises:
    InvalidInput: INVALID_BASE for a directory without config.json, weights or tokenizer.
    """
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise InvalidInput(f"no config.json in {str(directory)!r}", code=ErrorCode.INVALID_BASE, field="config.json")
    weights = sorted(directory.glob("*.safetensors"))
    if not weights:
        raise InvalidInput(
            f"no *.safetensors weights in {str(directory)!r}", code=ErrorCode.INVALID_BASE, field="weights"
        )
    try:
        shapes = read_base_linear_shapes(weights)
    except InvalidInput as e:
        raise InvalidInput(f"base weights unreadable: {e.message}", code=ErrorCode.INVALID_BASE, field=e.field) from e
    return {
        "content_digest": directory_digest(directory),
        "tokenizer_revision": tokenizer_digest(directory),
        "module_shapes": shapes,
        **config_facts(config_path.read_bytes()),
    }


def base_directory(record: BaseModelRecord, cache_dir: str | None = None) -> Path:
    if record.source_kind == "local":
        return Path(record.source)
    return resolve_hf_snapshot(record.source, record.base_model_commit, cache_dir)


def verify_base(record: BaseModelRecord, cache_dir: str | None = None) -> Path:
    """Recheck a pinned base on disk; a silent provider or file update is loud here.

    Raises:
        IntegrityFailure: BASE_DRIFT naming what changed (config, tokenizer, files, gone).
    """
    directory = base_directory(record, cache_dir)
    if not directory.is_dir():
        raise IntegrityFailure(
            f"base {record.label} is gone from {str(directory)!r}", code=ErrorCode.BASE_DRIFT, field="base_model_commit"
        )
    config_raw = (directory / "config.json").read_bytes()
    facts = config_facts(config_raw)
    if facts["config_sha256"] != record.config_sha256:
        raise IntegrityFailure(
            f"base {record.label} config drift: canonical config hash {facts['config_sha256'][:12]} "
            f"!= pinned {record.config_sha256[:12]} (rope now {facts['rope_scaling']}, pinned {record.rope_scaling})",
            code=ErrorCode.BASE_DRIFT,
            field="base_config_sha256",
        )
    if tokenizer_digest(directory) != record.tokenizer_revision:
        raise IntegrityFailure(
            f"base {record.label} tokenizer files changed since it was pinned",
            code=ErrorCode.BASE_DRIFT,
            field="tokenizer_revision",
        )
    digest = directory_digest(directory)
    if digest != record.content_digest:
        raise IntegrityFailure(
            f"base {record.label} content drift: files hash to {digest[:19]}, pinned {record.content_digest[:19]}",
            code=ErrorCode.BASE_DRIFT,
            field="base_model_commit",
        )
    return directory
