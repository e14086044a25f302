"""The model session: one pinned base loaded once, adapters attached to it in turn.

Loading re-verifies the base's digests and uses the adapter's bitsandbytes setup and
eager attention (CPU SDPA hides NaN). An adapter goes into one live PEFT slot: through
PEFT's own loading when its layers differ from the slot's, so PEFT's silent failures
show the way they would in serving, or by copying its tensors into the slot when the
layers are identical, which is what makes validating fifty adapters on one base cheap.
"""

from __future__ import annotations

import logging
import math
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loragate.registry.intake.catalog import verify_base
from loragate.registry.intake.golden import GoldenSet
from loragate.registry.records.bases import BaseModelRecord
from loragate.tasks.validation.greedy import greedy_completions


def base_load_kwargs(quantization_config: Mapping[str, Any] | None) -> dict[str, Any]:
    """``from_pretrained`` arguments loading a base the way an adapter was trained on it:
    float32, or bitsandbytes 4-bit computing in the manifest's dtype."""
    import torch
    from transformers import BitsAndBytesConfig

    if not (quantization_config and quantization_config.get("load_in_4bit")):
        return {"dtype": torch.float32}
    compute = getattr(torch, quantization_config["bnb_4bit_compute_dtype"])
    return {
        "dtype": compute,
        "quantization_config": BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_compute_dtype=compute,
            bnb_4bit_quant_type=quantization_config["bnb_4bit_quant_type"],
            bnb_4bit_use_double_quant=quantization_config["bnb_4bit_use_double_quant"],
        ),
    }


def quiet_loading() -> None:
    """transformers/PEFT/bitsandbytes chatter (progress bars, kernel notes) off."""
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    for noisy in ("bitsandbytes", "peft", "accelerate"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", category=UserWarning, module="peft")


@dataclass(frozen=True)
class Generation:
    """Greedy completions of a golden set, with what the checks need of the logits."""

    first_logits: Any  # [batch, vocab] logits of the first generated position
    nonfinite_logits: int
    token_ids: dict[str, list[int]]
    texts: dict[str, str]


@dataclass
class LiveAdapter:
    """The adapter slot attached to the base now, and what its fresh load built."""

    slot: str
    targets: Any
    shapes: dict[str, tuple[int, ...]]
    state: dict[str, Any]  # PEFT's views of the slot's LoRA tensors (updated in place by hotswaps)
    layers: list[Any]  # the LoRA layers holding the slot, whose scaling a hotswap sets
    on_meta: list[str]
    healthy: bool = False


@dataclass(frozen=True)
class Attachment:
    mode: str  # "fresh" (PEFT loaded it) or "hotswap" (tensors copied into the live slot)
    unexpected_keys: int | None = None  # what PEFT itself reported, for a fresh load
    missing_keys: int | None = None


def adapter_targets(adapter_config: Mapping[str, Any]) -> Any:
    targets = adapter_config.get("target_modules")
    return sorted(targets) if isinstance(targets, list) else targets


class BaseSession:
    """One pinned base loaded once, with adapters attached and removed one at a time."""

    def __init__(
        self,
        record: BaseModelRecord,
        quantization_config: Mapping[str, Any] | None,
        device: str = "cpu",
        hf_cache_dir: str | None = None,
    ):
        """Raises:
        IntegrityFailure: BASE_DRIFT when the base on disk no longer matches its pin.
        """
        from transformers import AutoModelForCausalLM, AutoTokenizer

        quiet_loading()
        self.record = record
        self.quantization_config = dict(quantization_config) if quantization_config else None
        self.device = device
        started = time.perf_counter()
        self.directory = verify_base(record, hf_cache_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(self.directory)
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForCausalLM.from_pretrained(
            self.directory, attn_implementation="eager", **base_load_kwargs(quantization_config)
        )
        if device != "cpu" and not quantization_config:
            self.model.to(device)
        self.model.eval()
        self.peft: Any = None
        self._slot = 0
        self.live: LiveAdapter | None = None
        self._base_runs: dict[str, Generation] = {}
        self._encodings: dict[str, Any] = {}
        # which golden cases a production version gets right, by (version, set digest)
        self.baseline_results: dict[tuple[str, str], dict[str, bool]] = {}
        self.load_seconds = time.perf_counter() - started

    # -- running prompts --------------------------------------------------------

    def generate(self, golden: GoldenSet) -> Generation:
        """Greedy completions of every case, in one padded batch, with the live adapter."""
        import torch

        if golden.digest not in self._encodings:
            prompts = [c.prompt for c in golden.cases]
            self._encodings[golden.digest] = self.tokenizer(prompts, return_tensors="pt", padding=True).to(self.device)
        enc = self._encodings[golden.digest]
        model = self.peft if self.peft is not None else self.model
        greedy = greedy_completions(model, self.tokenizer, enc, golden.cases, golden.max_tokens)
        steps = torch.stack([s.float() for s in greedy.step_logits])  # [steps, batch, vocab]
        return Generation(
            first_logits=greedy.step_logits[0].float(),
            nonfinite_logits=int((~torch.isfinite(steps)).sum()),
            token_ids=greedy.token_ids,
            texts=greedy.texts,
        )

    def base_run(self, golden: GoldenSet) -> Generation:
        """The bare base on a golden set, computed once per set and reused."""
        if golden.digest not in self._base_runs:
            if self.peft is not None:
                with self.peft.disable_adapter():
                    self._base_runs[golden.digest] = self.generate(golden)
            else:
                self._base_runs[golden.digest] = self.generate(golden)
        return self._base_runs[golden.digest]

    def tokens(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False).input_ids)

    # -- attaching adapters -----------------------------------------------------

    def attach(self, bundle_dir: Path, adapter_config: Mapping[str, Any], file_tensors: dict[str, Any]) -> Attachment:
        """Put the adapter in the live slot.

        A hotswap copies the new weights into the live slot's LoRA layers and sets their
        scaling, which is what PEFT's ``hotswap_adapter`` does, without its per-key module
        lookups (they cost more than the copy). It is only used when a fresh load would
        build exactly the same layers -- same target_modules, same tensor names and
        shapes, no DoRA or per-module patterns -- and the live slot itself loaded cleanly.
        Anything else goes through PEFT's own loading, so its silent failures show up the
        way they would in serving. PEFT raises plain exceptions on adapters it refuses.
        """
        from peft import PeftModel
        from peft.tuners.lora import LoraLayer
        from peft.utils import get_peft_model_state_dict

        targets = adapter_targets(adapter_config)
        shapes = {k: tuple(t.shape) for k, t in file_tensors.items()}
        plain = not (
            adapter_config.get("use_dora") or adapter_config.get("rank_pattern") or adapter_config.get("alpha_pattern")
        )
        live = self.live
        if live is not None and live.healthy and plain and live.targets == targets and live.shapes == shapes:
            import torch

            rank, alpha = adapter_config["r"], adapter_config["lora_alpha"]
            scaling = alpha / math.sqrt(rank) if adapter_config.get("use_rslora") else alpha / rank
            with torch.no_grad():
                for key, tensor in file_tensors.items():
                    live.state[key].copy_(tensor)
            for module in live.layers:
                module.scaling[live.slot] = scaling
            return Attachment("hotswap")
        self.detach()
        self._slot += 1
        slot = f"v{self._slot}"
        attachment = Attachment("fresh")
        if self.peft is None:
            self.peft = PeftModel.from_pretrained(
                self.model, str(bundle_dir), adapter_name=slot, low_cpu_mem_usage=True, is_trainable=False
            )
        else:
            result = self.peft.load_adapter(
                str(bundle_dir), adapter_name=slot, low_cpu_mem_usage=True, is_trainable=False
            )
            attachment = Attachment("fresh", len(result.unexpected_keys), len(result.missing_keys))
        self.peft.set_adapter(slot)
        self.peft.eval()
        self.live = LiveAdapter(
            slot=slot,
            targets=targets,
            shapes=shapes,
            state=get_peft_model_state_dict(self.peft, adapter_name=slot),
            layers=[m for m in self.peft.modules() if isinstance(m, LoraLayer) and slot in m.scaling],
            on_meta=sorted(n for n, p in self.peft.named_parameters() if f".{slot}." in n and p.device.type == "meta"),
        )
        return attachment

    def detach(self) -> None:
        if self.live is not None:
            if self.live.slot in self.peft.peft_config:
                self.peft.delete_adapter(self.live.slot)
            self.live = None

    def loaded_state(self, file_tensors: dict[str, Any]) -> dict[str, Any]:
        """Compare what PEFT holds in the live slot with the file, tensor by tensor."""
        import torch

        if self.live is None:
            raise RuntimeError("no adapter is attached")
        held = self.live.state
        missing = sorted(set(held) - set(file_tensors))  # initialised, never loaded
        dropped = sorted(set(file_tensors) - set(held))  # in the file, silently ignored
        shared = sorted(k for k in set(held) & set(file_tensors) if held[k].device.type != "meta")

        # PEFT round-trips weights through a float16/bfloat16 compute dtype: allow that
        # rounding (bfloat16 keeps ~3 significant digits), nothing like a weight left at init
        def close(keys: list[str]) -> bool:
            if not keys:
                return True
            a = torch.cat([held[k].detach().cpu().float().flatten() for k in keys])
            b = torch.cat([file_tensors[k].float().flatten() for k in keys])
            return torch.allclose(a, b, rtol=1e-2, atol=1e-6)

        # one comparison for the whole slot; per tensor only to name the culprits
        differing = [] if close(shared) else [k for k in shared if not close([k])]
        return {
            "lora_tensors_loaded": len(held),
            "lora_params_loaded": int(sum(t.numel() for t in held.values())),
            "missing_keys": missing[:5],
            "missing_count": len(missing),
            "unexpected_keys": dropped[:5],
            "unexpected_count": len(dropped),
            "differing_values": differing[:5],
            "meta_params": self.live.on_meta[:5],
            "meta_count": len(self.live.on_meta),
        }
