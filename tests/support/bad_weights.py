"""Bad weights: the cases of ``tests/test_bad_input.py`` that break a bundle's safetensors
file -- its structure (header, length, trailing bytes), its tensor values (NaN, infinity,
all-zero B, integers, tensors that are not LoRA's, A without B, ranks that disagree) and
its binding to the base's layers (a layer the base lacks, renamed prefixes, shapes not the
base's). Each is refused as invalid weights or a base mismatch, naming the weights file.
"""

from __future__ import annotations

import struct

import torch

from loragate.registry.errors import ErrorCode
from tests.support.bundle_mutations import NAME, Q_A, Q_B, WEIGHTS, raw_weights, rename_keys, set_value, tensors

# (case id, mutation, name, extra env, expected code, expected field)
WEIGHT_CASES = [
    # safetensors structure
    (
        "corrupt-header-json",
        raw_weights(lambda b: b[:8] + b"{not json" + b[17:]),
        NAME,
        {},
        ErrorCode.INVALID_WEIGHTS,
        WEIGHTS,
    ),
    ("truncated-file", raw_weights(lambda b: b[:-100]), NAME, {}, ErrorCode.INVALID_WEIGHTS, WEIGHTS),
    ("shorter-than-header", raw_weights(lambda b: b[:5]), NAME, {}, ErrorCode.INVALID_WEIGHTS, WEIGHTS),
    (
        "header-length-past-end",
        raw_weights(lambda b: struct.pack("<Q", len(b) * 2) + b[8:]),
        NAME,
        {},
        ErrorCode.INVALID_WEIGHTS,
        WEIGHTS,
    ),
    ("empty-file", raw_weights(lambda b: b""), NAME, {}, ErrorCode.INVALID_WEIGHTS, WEIGHTS),
    ("extra-bytes-after-data", raw_weights(lambda b: b + b"\0" * 16), NAME, {}, ErrorCode.INVALID_WEIGHTS, WEIGHTS),
    # tensor values
    ("nan-in-lora-a", tensors(set_value(Q_A, float("nan"))), NAME, {}, ErrorCode.INVALID_WEIGHTS, WEIGHTS),
    ("inf-in-lora-b", tensors(set_value(Q_B, float("inf"))), NAME, {}, ErrorCode.INVALID_WEIGHTS, WEIGHTS),
    (
        "all-lora-b-zero",
        tensors(lambda sd: [sd.__setitem__(k, torch.zeros_like(v)) for k, v in list(sd.items()) if "lora_B" in k]),
        NAME,
        {},
        ErrorCode.INVALID_WEIGHTS,
        WEIGHTS,
    ),
    (
        "integer-tensor",
        tensors(lambda sd: sd.__setitem__(Q_A, sd[Q_A].to(torch.int32))),
        NAME,
        {},
        ErrorCode.INVALID_WEIGHTS,
        WEIGHTS,
    ),
    (
        "non-lora-tensor",
        tensors(lambda sd: sd.__setitem__("base_model.model.lm_head.weight", torch.ones(4, 4))),
        NAME,
        {},
        ErrorCode.INVALID_WEIGHTS,
        WEIGHTS,
    ),
    ("lora-a-without-b", tensors(lambda sd: sd.pop(Q_B)), NAME, {}, ErrorCode.INVALID_WEIGHTS, WEIGHTS),
    (
        "a-b-rank-disagree",
        tensors(lambda sd: sd.__setitem__(Q_B, sd[Q_B][:, :4].contiguous())),
        NAME,
        {},
        ErrorCode.INVALID_WEIGHTS,
        WEIGHTS,
    ),
    (
        "key-prefix-stripped",
        tensors(rename_keys("base_model.model.", "")),
        NAME,
        {},
        ErrorCode.INVALID_WEIGHTS,
        WEIGHTS,
    ),
    # binding to the base's layers
    ("layer-not-in-base", tensors(rename_keys("layers.1.", "layers.7.")), NAME, {}, ErrorCode.BASE_MISMATCH, WEIGHTS),
    (
        "renamed-layer-prefix",
        tensors(rename_keys("model.model.layers", "model.decoder.layers")),
        NAME,
        {},
        ErrorCode.BASE_MISMATCH,
        WEIGHTS,
    ),
    (
        "shape-not-base-shape",
        tensors(lambda sd: sd.__setitem__(Q_A, sd[Q_A][:, :64].contiguous())),
        NAME,
        {},
        ErrorCode.BASE_MISMATCH,
        WEIGHTS,
    ),
]
