"""A request of the base model gets no adapter's delta on vLLM's CPU LoRA path.

vLLM marks a batch row that uses no adapter with the slot index -1 ("no LoRA"). The Triton
kernels skip such a row; the PyTorch ops the CPU platform runs (``vllm.lora.ops.torch_ops``)
gather ``weights[indices]`` instead, and index -1 is the *last* slot (``--max-loras`` - 1). In
a batch holding at least one adapter's request, every base row -- a client's request of the
base, and loragate's fallback answered "by the base" -- gets the delta of whichever adapter
sits in that slot: another tenant's bytes, with no error (loragate issue 56; upstream the fix
is vllm-project/vllm#48421, still open). A batch of base rows alone is skipped by vLLM's own
``no_lora`` flag and was right.

``skip_the_base_rows`` replaces the three gathering ops (the ``sgmv_*`` prefill ops call them)
with versions that gather slot 0 for a -1 row and multiply its delta by 0: a row with an
adapter computes exactly what vLLM computed, a base row gets nothing added. No data-dependent
branch: the ops stay traceable by ``torch.compile``. Applied only where the ops are the ones
this was written for (their signatures); otherwise nothing is patched and ``base_rows_guarded``
says so. Every process of a replica runs the plugin, the worker's included.

``LORAGATE_CPU_LORA_OPS=vllm`` in the replica's environment keeps vLLM's own ops: the
baseline of ``bench/fallback_bytes.py``, which measures what the patch prevents; any other
value (or none) guards.
"""

from __future__ import annotations

import inspect
import logging
import os
from typing import Any

log = logging.getLogger("loragate_resolver.cpu_lora_ops")

OPS_VARIABLE = "LORAGATE_CPU_LORA_OPS"
VLLM_OPS = "vllm"  # the benchmark's baseline: vLLM's ops as they are

# the op -> the parameters vLLM 0.32's version takes, in order: another signature is another op
_KNOWN = {
    "bgmv_shrink": ["inputs", "lora_b_weights", "output_tensor", "lora_indices_tensor", "scaling"],
    "bgmv_expand": ["inputs", "lora_b_weights", "output_tensor", "lora_indices_tensor", "add_inputs"],
    "bgmv_expand_slice": [
        "inputs",
        "lora_b_weights",
        "output_tensor",
        "lora_indices_tensor",
        "slice_offset",
        "slice_size",
        "add_inputs",
    ],
}
_guarded = False


def base_rows_guarded() -> bool:
    """Whether this process's CPU LoRA ops leave a base row alone."""
    return _guarded


def _deltas(inputs: Any, weights: Any, indices: Any, dtype: Any) -> Any:
    """Each row's ``inputs @ weights[slot].T``, zero where the row's slot is -1."""
    import torch

    selected = weights[indices.clamp_min(0)].to(dtype=dtype)
    if len(selected.shape) == 4:
        selected = selected.squeeze(dim=1)
    outputs = torch.einsum("bi, boi -> bo", inputs.to(dtype=dtype), selected)
    return outputs * (indices >= 0).to(dtype=dtype).unsqueeze(-1)


def bgmv_shrink(inputs, lora_b_weights, output_tensor, lora_indices_tensor, scaling=1.0):  # type: ignore[no-untyped-def]
    outputs = _deltas(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    output_tensor[:, : outputs.shape[1]] = scaling * outputs[:]


def bgmv_expand(inputs, lora_b_weights, output_tensor, lora_indices_tensor, add_inputs=True):  # type: ignore[no-untyped-def]
    outputs = _deltas(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    limit = output_tensor.shape[0]
    if outputs.shape[0] == 1 and output_tensor.shape[0] != 1:
        limit = 1
    common_len = min(outputs.shape[1], output_tensor.shape[1])
    if add_inputs:
        output_tensor[:, :common_len] += outputs[:limit, :common_len]
    else:
        output_tensor[:, :common_len] = outputs[:limit, :common_len]


def bgmv_expand_slice(  # type: ignore[no-untyped-def]
    inputs, lora_b_weights, output_tensor, lora_indices_tensor, slice_offset, slice_size, add_inputs=True
):
    outputs = _deltas(inputs, lora_b_weights, lora_indices_tensor, output_tensor.dtype)
    if add_inputs:
        output_tensor[:, slice_offset : slice_offset + slice_size] += outputs[:]
    else:
        output_tensor[:, slice_offset : slice_offset + slice_size] = outputs[:]


_REPLACEMENTS = {"bgmv_shrink": bgmv_shrink, "bgmv_expand": bgmv_expand, "bgmv_expand_slice": bgmv_expand_slice}


def skip_the_base_rows() -> bool:
    """Patch vLLM's CPU LoRA ops (module docstring) where they are the known ones; True when
    patched (or already)."""
    global _guarded
    if os.environ.get(OPS_VARIABLE) == VLLM_OPS:
        log.warning("loragate: %s=%s: vLLM's own CPU LoRA ops kept, base rows unguarded", OPS_VARIABLE, VLLM_OPS)
        return False
    try:
        from vllm.lora.ops import torch_ops
        from vllm.lora.ops.torch_ops import lora_ops
        from vllm.lora.punica_wrapper import punica_cpu
    except Exception:  # another vLLM, or none: patch nothing
        log.warning("loragate: vLLM's CPU LoRA ops not found; base rows are left as vLLM computes them")
        return False
    for name, parameters in _KNOWN.items():
        current = getattr(lora_ops, name, None)
        if current is _REPLACEMENTS[name]:
            continue
        if current is None or list(inspect.signature(current).parameters) != parameters:
            log.warning("loragate: vLLM's %s is not the one loragate knows; base rows left unguarded", name)
            return False
    # sgmv_* call the bgmv ops through lora_ops' globals; the package and punica_cpu hold them
    # by name
    for module in (lora_ops, torch_ops, punica_cpu):
        for name, replacement in _REPLACEMENTS.items():
            if hasattr(module, name):
                setattr(module, name, replacement)
    _guarded = True
    return True
