"""The silent-failure corpus: real adapter bundles broken the ways LoRA breaks quietly.

Each builder copies a working bundle and damages one thing, reproducing one of the silent
failures shadow validation's checks name (docs/concepts/gates.md) or one of the seed's six
modes. None of them makes PEFT or vLLM raise an error by itself (except the fully missing
target module); the shadow-validation gate has to notice.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

WEIGHTS = "adapter_model.safetensors"


def copy_bundle(src: Path, dest: Path) -> Path:
    dest = Path(dest)
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(src, dest)
    return dest


def edit_tensors(bundle: Path, fn: Callable[[dict], dict | None]) -> None:
    from safetensors.torch import load_file, save_file

    sd = load_file(bundle / WEIGHTS)
    sd = fn(sd) or sd
    save_file({k: v.contiguous() for k, v in sd.items()}, bundle / WEIGHTS)


def _edit_json(bundle: Path, name: str, changes: dict[str, Any]) -> None:
    path = bundle / name
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data, indent=2, sort_keys=True))


def _set_targets(bundle: Path, targets: list[str]) -> None:
    _edit_json(bundle, "adapter_config.json", {"target_modules": targets})
    _edit_json(bundle, "manifest.json", {"target_modules": sorted(targets)})


def partial_targets(src: Path, dest: Path, drop: str = "v_proj") -> Path:
    """Config targets a module whose weights the file lacks: LoRA left on meta / at init."""
    b = copy_bundle(src, dest)
    edit_tensors(b, lambda sd: {k: v for k, v in sd.items() if f".{drop}." not in k})
    return b


def missing_target(src: Path, dest: Path) -> Path:
    """Targets a module the base does not have at all (GPT-2's c_attn on a Llama)."""
    b = copy_bundle(src, dest)
    edit_tensors(b, lambda sd: {k.replace("q_proj", "c_attn"): v for k, v in sd.items() if ".q_proj." in k})
    _set_targets(b, ["c_attn"])
    return b


def fewer_targets_in_config(src: Path, dest: Path, keep: str = "q_proj") -> Path:
    """Config lists fewer modules than the file holds: PEFT silently drops the rest."""
    b = copy_bundle(src, dest)
    _set_targets(b, [keep])
    return b


def renamed_layer_prefix(src: Path, dest: Path) -> Path:
    """Keys under another layer prefix: loads with a warning only, B stays zero."""
    b = copy_bundle(src, dest)
    edit_tensors(
        b, lambda sd: {k.replace("model.model.layers", "model.model.decoder_layers"): v for k, v in sd.items()}
    )
    return b


def nan_in_q_proj(src: Path, dest: Path) -> Path:
    """One NaN in a q_proj LoRA weight: CPU SDPA without padding hides it."""
    b = copy_bundle(src, dest)

    def poison(sd):
        key = next(k for k in sorted(sd) if "q_proj.lora_A" in k)
        sd[key] = sd[key].clone()
        sd[key][0, 0] = float("nan")

    edit_tensors(b, poison)
    return b


def zero_lora_b(src: Path, dest: Path) -> Path:
    """Every lora_B zero: loads fine, changes nothing."""
    import torch

    b = copy_bundle(src, dest)
    edit_tensors(b, lambda sd: {k: (torch.zeros_like(v) if "lora_B" in k else v) for k, v in sd.items()})
    return b


def with_alpha(src: Path, dest: Path, alpha: float) -> Path:
    """The same tensors under another lora_alpha, in adapter_config.json and the manifest."""
    b = copy_bundle(src, dest)
    _edit_json(b, "adapter_config.json", {"lora_alpha": alpha})
    _edit_json(b, "manifest.json", {"lora_alpha": alpha})
    return b


def zero_alpha(src: Path, dest: Path) -> Path:
    """lora_alpha 0 scales the adapter to nothing."""
    return with_alpha(src, dest, 0)


def large_activations(src: Path, dest: Path, compute_dtype: str, scale: float = 100.0) -> Path:
    """Attention logits beyond float16's range, declared for a 4-bit base computing in
    ``compute_dtype``: finite in bfloat16/float32, NaN in float16."""
    b = copy_bundle(src, dest)
    edit_tensors(
        b, lambda sd: {k: (v * scale if ("q_proj.lora_B" in k or "k_proj.lora_B" in k) else v) for k, v in sd.items()}
    )
    _edit_json(
        b,
        "manifest.json",
        {
            "quantization_config": {
                "load_in_4bit": True,
                "bnb_4bit_compute_dtype": compute_dtype,
                "bnb_4bit_quant_type": "nf4",
                "bnb_4bit_use_double_quant": False,
            }
        },
    )
    return b


def planted_outlier(src: Path, dest: Path, *, layer: int, module: str, rows: int = 4) -> Path:
    """One module's update concentrated on a few outputs, the rest of the adapter as it
    was: the shape a planted behaviour leaves in the weights (adaptersentry's toy payload).
    The module keeps its update's size; only ``rows`` output rows of its lora_B carry it."""
    b = copy_bundle(src, dest)
    suffix = f"layers.{layer}.{'mlp' if module in ('gate_proj', 'up_proj', 'down_proj') else 'self_attn'}.{module}"

    def concentrate(sd):
        key = next(k for k in sd if f"{suffix}.lora_B" in k)
        update = sd[key].clone()
        planted = update.new_zeros(update.shape)
        planted[:rows] = update[:rows] * (update.norm() / update[:rows].norm())
        sd[key] = planted

    edit_tensors(b, concentrate)
    return b


def bound_to(src: Path, dest: Path, **manifest_fields: Any) -> Path:
    """The same adapter with other base-binding fields in its manifest."""
    b = copy_bundle(src, dest)
    _edit_json(b, "manifest.json", manifest_fields)
    return b


def tamper_rope_in_place(base_dir: Path) -> None:
    """A provider rewrites the base's RoPE settings under the same name and path."""
    config = json.loads((base_dir / "config.json").read_text())
    config["rope_parameters"] = {**config.get("rope_parameters", {}), "rope_type": "linear", "factor": 2.0}
    (base_dir / "config.json").write_text(json.dumps(config, indent=2))


def tamper_weights_in_place(base_dir: Path) -> None:
    """A provider silently re-uploads slightly different base weights."""
    from safetensors.torch import load_file, save_file

    path = base_dir / "model.safetensors"
    sd = load_file(path)
    key = next(k for k in sorted(sd) if k.endswith("down_proj.weight"))
    sd[key] = sd[key] * 1.01
    save_file(sd, path, metadata={"format": "pt"})
