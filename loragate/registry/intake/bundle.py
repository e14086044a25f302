"""An adapter bundle: ``adapter_model.safetensors`` + ``adapter_config.json`` + ``manifest.json``.

Registration first copies the three files into a private snapshot while hashing them, so
the bytes that are checked are exactly the bytes that get stored (the source directory
may change under us). A file may be a symlink only if it resolves inside the bundle
directory; sizes are capped before and during the copy.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loragate.registry.digests import CHUNK, sha256_bytes
from loragate.registry.errors import ErrorCode, InvalidInput
from loragate.registry.intake.manifest import Manifest, parse_json_object
from loragate.registry.intake.weights import WeightsSummary
from loragate.registry.storage.bundle_files import (
    ADAPTER_CONFIG_FILE,
    BUNDLE_FILES,
    MANIFEST_FILE,
    WEIGHTS_FILE,
    open_regular,
)
from loragate.registry.storage.scratch import scratch_dir


@dataclass(frozen=True)
class BundleSnapshot:
    weights_path: Path
    weights_sha256: str
    weights_size: int
    adapter_config_raw: bytes
    manifest_raw: bytes

    @property
    def adapter_config_sha256(self) -> str:
        return sha256_bytes(self.adapter_config_raw)


@contextmanager
def snapshot_bundle(src: Path, *, max_weights_bytes: int, max_json_bytes: int) -> Iterator[BundleSnapshot]:
    """Copy the bundle's three files into a private snapshot while hashing them.

    Raises:
        InvalidInput: INVALID_BUNDLE for a missing or unreadable file, a symlink out of the
            bundle or a file that is not regular (a FIFO, a device, a directory); TOO_LARGE
            past a size limit.
    """
    src = Path(src)
    if not src.is_dir():
        raise InvalidInput(
            f"bundle directory {str(src)!r} does not exist or is not a directory",
            code=ErrorCode.INVALID_BUNDLE,
            field="bundle",
        )
    root = src.resolve()
    limits = {WEIGHTS_FILE: max_weights_bytes, ADAPTER_CONFIG_FILE: max_json_bytes, MANIFEST_FILE: max_json_bytes}
    with scratch_dir("bundle") as tmp:
        copied: dict[str, tuple[Path, str, int]] = {}
        for name in BUNDLE_FILES:
            copied[name] = _copy_checked(root, name, tmp / name, limits[name])
        weights_path, weights_hex, weights_size = copied[WEIGHTS_FILE]
        yield BundleSnapshot(
            weights_path=weights_path,
            weights_sha256=weights_hex,
            weights_size=weights_size,
            adapter_config_raw=copied[ADAPTER_CONFIG_FILE][0].read_bytes(),
            manifest_raw=copied[MANIFEST_FILE][0].read_bytes(),
        )


def _copy_checked(root: Path, name: str, dest: Path, limit: int) -> tuple[Path, str, int]:
    path = root / name
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise InvalidInput(f"bundle has no {name}", code=ErrorCode.INVALID_BUNDLE, field=name) from None
    if stat.S_ISLNK(st.st_mode):
        target = path.resolve()
        if root not in target.parents:
            raise InvalidInput(
                f"{name} is a symlink to {str(target)!r}, outside the bundle directory",
                code=ErrorCode.INVALID_BUNDLE,
                field=name,
            )
        path = target
    with os.fdopen(open_regular(path, field=name), "rb") as f:
        size_now = os.fstat(f.fileno()).st_size
        if size_now > limit:
            raise InvalidInput(
                f"{name} is {size_now} bytes, over the {limit}-byte limit", code=ErrorCode.TOO_LARGE, field=name
            )
        h = hashlib.sha256()
        size = 0
        with open(dest, "wb") as out:
            for chunk in iter(lambda: f.read(CHUNK), b""):
                size += len(chunk)
                if size > limit:
                    raise InvalidInput(
                        f"{name} grew past the {limit}-byte limit while being read",
                        code=ErrorCode.TOO_LARGE,
                        field=name,
                    )
                h.update(chunk)
                out.write(chunk)
    return dest, h.hexdigest(), size


def parse_adapter_config(raw: bytes) -> dict[str, Any]:
    return parse_json_object(
        raw, what=ADAPTER_CONFIG_FILE, code=ErrorCode.INVALID_ADAPTER_CONFIG, field=ADAPTER_CONFIG_FILE
    )


def _mismatch(field: str, message: str) -> InvalidInput:
    return InvalidInput(message, code=ErrorCode.MANIFEST_MISMATCH, field=field)


def _unsupported(key: str, message: str) -> InvalidInput:
    return InvalidInput(
        f"adapter_config.{key}: {message}", code=ErrorCode.INVALID_ADAPTER_CONFIG, field=f"adapter_config.{key}"
    )


def check_adapter_config(cfg: dict[str, Any], manifest: Manifest, base_names: set[str]) -> None:
    """PEFT's adapter_config.json must say what the manifest says, and be servable.

    ``base_names`` are the spellings under which the pinned base may appear in
    ``base_model_name_or_path``: its catalog id, its hub id or its directory.

    Raises:
        InvalidInput: MANIFEST_MISMATCH naming the field that disagrees, or
        INVALID_ADAPTER_CONFIG for what vLLM cannot serve.
    """
    if cfg.get("peft_type") != "LORA":
        raise _unsupported("peft_type", f"is {cfg.get('peft_type')!r}; only LORA adapters are served")
    if cfg.get("task_type") not in (None, "CAUSAL_LM"):
        raise _unsupported("task_type", f"is {cfg.get('task_type')!r}; only CAUSAL_LM is served")
    if cfg.get("use_dora"):
        raise _unsupported("use_dora", "DoRA adapters cannot be served by vLLM's LoRA path")
    if cfg.get("modules_to_save"):
        raise _unsupported("modules_to_save", "full-weight modules are not served by vLLM's LoRA path")
    if cfg.get("bias", "none") != "none":
        raise _unsupported("bias", f"is {cfg.get('bias')!r}; only 'none' is served")
    for key in ("rank_pattern", "alpha_pattern"):
        if cfg.get(key):
            raise _unsupported(key, "per-module ranks or alphas are not supported; use one rank and alpha")
    for key in ("layers_to_transform", "layers_pattern"):
        if cfg.get(key) not in (None, [], ""):
            raise _unsupported(key, "layer selection is not supported; target modules by name")

    if cfg.get("r") != manifest.lora_rank:
        raise _mismatch("lora_rank", f"manifest lora_rank {manifest.lora_rank} != adapter_config r {cfg.get('r')!r}")
    if cfg.get("lora_alpha") != manifest.lora_alpha:
        raise _mismatch(
            "lora_alpha",
            f"manifest lora_alpha {manifest.lora_alpha} != adapter_config lora_alpha {cfg.get('lora_alpha')!r}",
        )
    if cfg.get("lora_dropout", 0.0) != manifest.lora_dropout:
        raise _mismatch(
            "lora_dropout",
            f"manifest lora_dropout {manifest.lora_dropout} != adapter_config lora_dropout {cfg.get('lora_dropout')!r}",
        )
    cfg_targets = cfg.get("target_modules")
    if isinstance(cfg_targets, list):
        cfg_targets = sorted(set(cfg_targets))
    if cfg_targets != manifest.target_modules:
        raise _mismatch(
            "target_modules",
            f"manifest target_modules {manifest.target_modules!r} != "
            f"adapter_config target_modules {cfg.get('target_modules')!r}",
        )
    named = cfg.get("base_model_name_or_path")
    if named not in base_names:
        raise _mismatch(
            "base_model_id",
            f"adapter_config base_model_name_or_path {named!r} is not the manifest's base "
            f"{manifest.base_model_id!r} (accepted spellings: {sorted(base_names)})",
        )
    revision = cfg.get("revision")
    if revision not in (None, "", "main") and revision != manifest.base_model_commit:
        raise _mismatch(
            "base_model_commit",
            f"adapter_config revision {revision!r} != manifest base_model_commit {manifest.base_model_commit!r}",
        )


def check_weights_against(
    weights: WeightsSummary,
    manifest: Manifest,
    *,
    max_lora_rank: int,
    base_shapes: dict[str, list[int]],
    base_label: str,
) -> None:
    """Shapes must fit the rank, the target modules and the pinned base's layers.

    Raises:
        InvalidInput: MANIFEST_MISMATCH (rank, target modules), RANK_LIMIT, or BASE_MISMATCH
        for a module the pinned base does not have in that shape.
    """
    import re

    for module in weights.modules.values():
        if module.rank != manifest.lora_rank:
            raise _mismatch(
                "lora_rank",
                f"module {module.path!r} has rank {module.rank}, manifest lora_rank is {manifest.lora_rank}",
            )
    if manifest.lora_rank > max_lora_rank:
        raise InvalidInput(
            f"lora_rank {manifest.lora_rank} is above the fleet's max_lora_rank {max_lora_rank}",
            code=ErrorCode.RANK_LIMIT,
            field="lora_rank",
        )
    targets = manifest.target_modules
    if isinstance(targets, str):
        unmatched = sorted(p for p in weights.modules if not re.fullmatch(targets, p))
        if unmatched:
            raise _mismatch(
                "target_modules",
                f"modules {unmatched[:3]} in the weights do not match target_modules {targets!r}; "
                "PEFT would drop them silently",
            )
    else:
        extra = sorted(weights.leaf_names - set(targets))
        if extra:
            raise _mismatch(
                "target_modules",
                f"weights hold modules {extra} that target_modules {targets} leaves out; PEFT would drop them silently",
            )
        missing = sorted(set(targets) - weights.leaf_names)
        if missing:
            raise _mismatch("target_modules", f"target_modules {missing} match nothing in the weights")
    for module in weights.modules.values():
        shape = base_shapes.get(module.path + ".weight")
        if shape is None:
            raise InvalidInput(
                f"module {module.path!r} does not exist in base {base_label} "
                "(layer-prefix mismatch or a base with other layers)",
                code=ErrorCode.BASE_MISMATCH,
                field=WEIGHTS_FILE,
            )
        if shape != [module.out_features, module.in_features]:
            raise InvalidInput(
                f"module {module.path!r} is [{module.out_features}, {module.in_features}] "
                f"but the base layer is {shape} in {base_label}",
                code=ErrorCode.BASE_MISMATCH,
                field=WEIGHTS_FILE,
            )


def publish_dir(staging: Path, dest: Path) -> None:
    """Make a fully written directory appear at ``dest`` at once: fsync, then rename.

    A reader sees the whole bundle or nothing, never a half-written one.
    """
    for path in staging.iterdir():
        with open(path, "rb") as f:
            os.fsync(f.fileno())
    directory = os.open(staging, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)
    os.rename(staging, dest)
