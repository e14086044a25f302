"""Reading a LoRA ``adapter_model.safetensors`` without trusting it.

The header is parsed by hand so that every structural fault (short file, header past the
end, overlapping or out-of-range offsets, wrong byte counts, unknown dtypes) becomes a
typed error naming the tensor, instead of whatever a loader would do. Tensor values are
checked on their raw bits through a memory map (NaN/Inf by an all-ones exponent, zero by
all-zero magnitude bits), so float16, bfloat16 and float32 need no framework at all.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field
from pathlib import Path

from loragate.registry.errors import ErrorCode, InvalidInput
from loragate.registry.intake.jsonio import loads_object

MAX_HEADER_BYTES = 64 << 20

# dtype -> (bytes per element, unsigned view, exponent mask, magnitude mask)
_FLOAT_BITS = {
    "F32": (4, "uint32", 0x7F800000, 0x7FFFFFFF),
    "F16": (2, "uint16", 0x7C00, 0x7FFF),
    "BF16": (2, "uint16", 0x7F80, 0x7FFF),
}
_OTHER_DTYPE_SIZES = {"F64": 8, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}

# PEFT writes LoRA tensors as base_model.model.<module path>.lora_{A,B}.weight
PEFT_PREFIX = "base_model.model."
_LORA_KEY = re.compile(r"^(?P<module>.+)\.lora_(?P<ab>[AB])\.weight$")
FIELD = "adapter_model.safetensors"


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int


@dataclass(frozen=True)
class LoraModule:
    """One adapted linear layer: A is [rank, in_features], B is [out_features, rank]."""

    path: str  # module path inside the base model, e.g. model.layers.0.self_attn.q_proj
    rank: int
    in_features: int
    out_features: int
    dtype: str

    @property
    def leaf(self) -> str:
        return self.path.rsplit(".", 1)[-1]


@dataclass(frozen=True)
class WeightsSummary:
    size: int
    tensors: dict[str, TensorInfo]
    modules: dict[str, LoraModule] = field(default_factory=dict)
    data_start: int = 0

    @property
    def leaf_names(self) -> set[str]:
        return {m.leaf for m in self.modules.values()}

    @property
    def parameter_count(self) -> int:
        return sum(m.rank * (m.in_features + m.out_features) for m in self.modules.values())


def _bad(message: str, field: str = FIELD) -> InvalidInput:
    return InvalidInput(message, code=ErrorCode.INVALID_WEIGHTS, field=field)


def read_header(path: Path, field: str = FIELD) -> tuple[dict[str, TensorInfo], int]:
    """Parse and check the header; return the tensors and the data section's offset."""
    try:
        return _read_header(path)
    except InvalidInput as e:
        e.field = field
        raise


def _read_header(path: Path) -> tuple[dict[str, TensorInfo], int]:
    size = path.stat().st_size
    if size < 8:
        raise _bad(f"file is {size} bytes, shorter than the 8-byte safetensors header length")
    with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        if header_len > MAX_HEADER_BYTES or 8 + header_len > size:
            raise _bad(f"header length {header_len} runs past the end of a {size}-byte file (truncated?)")
        raw = f.read(header_len)
    header = loads_object(raw, what="safetensors header", code=ErrorCode.INVALID_WEIGHTS, field=FIELD)
    header.pop("__metadata__", None)
    data_start = 8 + header_len
    data_len = size - data_start
    tensors: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        tensors[name] = _tensor_info(name, entry, data_len)
    spans = sorted((t.start, t.end, t.name) for t in tensors.values())
    cursor = 0
    for start, end, name in spans:
        if start != cursor:
            raise _bad(f"tensor {name!r} starts at byte {start}, expected {cursor}: overlapping data or a hole")
        cursor = end
    if cursor != data_len:
        raise _bad(f"tensors cover {cursor} bytes of a {data_len}-byte data section (truncated or padded file)")
    return tensors, data_start


def _tensor_info(name: str, entry: object, data_len: int) -> TensorInfo:
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        raise _bad(f"tensor {name!r} header entry is malformed")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(dtype, str):
        raise _bad(f"tensor {name!r} has a dtype that is not a string: {dtype!r:.40}")
    if dtype in _FLOAT_BITS:
        itemsize = _FLOAT_BITS[dtype][0]
    elif dtype in _OTHER_DTYPE_SIZES:
        itemsize = _OTHER_DTYPE_SIZES[dtype]
    else:
        raise _bad(f"tensor {name!r} has unknown dtype {dtype!r}")
    if not (isinstance(shape, list) and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
        raise _bad(f"tensor {name!r} has an invalid shape {shape!r}")
    if not (
        isinstance(offsets, list)
        and len(offsets) == 2
        and all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
        and 0 <= offsets[0] <= offsets[1] <= data_len
    ):
        raise _bad(f"tensor {name!r} has data offsets {offsets!r} outside the {data_len}-byte data section")
    count = 1
    for d in shape:
        count *= d
    if count * itemsize != offsets[1] - offsets[0]:
        raise _bad(
            f"tensor {name!r} claims shape {shape} of {dtype} ({count * itemsize} bytes) "
            f"but spans {offsets[1] - offsets[0]} bytes"
        )
    return TensorInfo(name, dtype, tuple(shape), offsets[0], offsets[1])


def read_lora_structure(path: Path) -> WeightsSummary:
    """Check the header, key names, dtypes and A/B pairing of a PEFT LoRA weights file.

    Raises:
        InvalidInput: INVALID_WEIGHTS naming the tensor or the structural fault.
    """
    tensors, data_start = read_header(path)
    if not tensors:
        raise _bad("file holds no tensors")
    pairs: dict[str, dict[str, TensorInfo]] = {}
    for name, info in tensors.items():
        if not name.startswith(PEFT_PREFIX):
            raise _bad(
                f"tensor {name!r} lacks the PEFT prefix {PEFT_PREFIX!r} (renamed or stripped keys load with no effect)"
            )
        m = _LORA_KEY.match(name[len(PEFT_PREFIX) :])
        if not m:
            raise _bad(
                f"tensor {name!r} is not a LoRA A/B weight; loragate serves plain LoRA "
                "(no DoRA magnitudes, biases, embeddings or modules_to_save)"
            )
        if info.dtype not in _FLOAT_BITS:
            raise _bad(f"tensor {name!r} has dtype {info.dtype}; LoRA weights must be F32, F16 or BF16")
        if len(info.shape) != 2:
            raise _bad(f"tensor {name!r} has shape {list(info.shape)}; LoRA weights are 2-D")
        pairs.setdefault(m["module"], {})[m["ab"]] = info

    modules: dict[str, LoraModule] = {}
    for module, ab in sorted(pairs.items()):
        if set(ab) != {"A", "B"}:
            missing = ({"A", "B"} - set(ab)).pop()
            raise _bad(f"module {module!r} has no lora_{missing} tensor")
        a, b = ab["A"], ab["B"]
        rank, in_features = a.shape
        out_features, b_rank = b.shape
        if rank != b_rank or rank < 1:
            raise _bad(f"module {module!r}: lora_A rank {rank} and lora_B rank {b_rank} disagree")
        if a.dtype != b.dtype:
            raise _bad(f"module {module!r}: lora_A is {a.dtype} but lora_B is {b.dtype}")
        modules[module] = LoraModule(module, rank, in_features, out_features, a.dtype)
    return WeightsSummary(size=path.stat().st_size, tensors=tensors, modules=modules, data_start=data_start)


@dataclass(frozen=True)
class ValueScan:
    nonfinite_tensors: tuple[str, ...]
    any_lora_b_nonzero: bool

    def problem(self) -> str | None:
        if self.nonfinite_tensors:
            more = f" and {len(self.nonfinite_tensors) - 1} more" if len(self.nonfinite_tensors) > 1 else ""
            return f"tensor {self.nonfinite_tensors[0]!r}{more} holds NaN or Inf values"
        if not self.any_lora_b_nonzero:
            return "every lora_B tensor is all zero: the adapter cannot change the base model's output"
        return None


def scan_lora_values(path: Path, header: tuple[dict[str, TensorInfo], int] | None = None) -> ValueScan:
    """NaN/Inf anywhere, and whether any lora_B is non-zero, read from the raw bits.

    ``header`` is ``read_header(path)`` when the caller parsed it already."""
    import numpy as np  # here, not at the top: read-only commands never scan values

    tensors, data_start = header or read_header(path)
    nonfinite = []
    any_b_nonzero = False
    raw = np.memmap(path, dtype=np.uint8, mode="r") if path.stat().st_size else np.zeros(0, np.uint8)
    try:
        for info in sorted(tensors.values(), key=lambda t: t.name):
            if info.dtype not in _FLOAT_BITS:
                continue
            _, view, exp_mask, mag_mask = _FLOAT_BITS[info.dtype]
            bits = raw[data_start + info.start : data_start + info.end].view(view)
            if np.any((bits & exp_mask) == exp_mask):
                nonfinite.append(info.name)
            if info.name.endswith(".lora_B.weight") and not any_b_nonzero:
                any_b_nonzero = bool(np.any(bits & mag_mask))
    finally:
        del raw
    return ValueScan(tuple(nonfinite), any_b_nonzero)


def inspect_lora_weights(path: Path) -> WeightsSummary:
    """Structure and values: every tensor finite, at least one lora_B non-zero.

    Raises:
        InvalidInput: INVALID_WEIGHTS for a structural fault, NaN/Inf or an all-zero lora_B.
    """
    summary = read_lora_structure(path)
    problem = scan_lora_values(path, (summary.tensors, summary.data_start)).problem()
    if problem:
        raise _bad(problem)
    return summary


def read_base_linear_shapes(paths: list[Path]) -> dict[str, list[int]]:
    """2-D weight shapes of a base model's safetensors files, by parameter name."""
    shapes: dict[str, list[int]] = {}
    for p in paths:
        tensors, _ = read_header(p, field=p.name)
        for name, info in tensors.items():
            if len(info.shape) == 2 and name.endswith(".weight"):
                shapes[name] = list(info.shape)
    return shapes
