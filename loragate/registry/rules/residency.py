"""Residency: how much memory each adapter of a base takes, and how many a replica must hold.

vLLM keeps adapters in two tiers: ``max_loras`` slots on the accelerator, each sized at the
replica's ``max_lora_rank`` for every LoRA-capable module of the base (vLLM allocates the
stacked A and B buffers when it wraps the model, whatever the adapters will target), and an
LRU cache of ``max_cpu_loras`` adapters in host memory, each at its own rank and modules.
An adapter in neither is read from disk again on its next request.

From the registry's facts -- each served version's manifest (``lora_rank``,
``target_modules``) and the pinned base's ``config.json`` -- a ``ResidencyPlan`` says how many
slots and cache entries a replica of one role needs: every served version and warm copy in
the cache, and slots for the pinned ones, the warm copies and a working-set headroom. Pure
arithmetic, like ``fleet``: the registry's service gathers the inputs.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from loragate.registry.errors import ErrorCode, InvalidInput
from loragate.registry.rules.fleet import AdapterPointers, ReplicaRole, served_version, warm_versions

# the linear layers of a LLaMA-style decoder layer, as PEFT names them, with where they sit
# (PEFT matches a regular-expression target_modules against the full module path)
ATTENTION_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_MODULES = ("gate_proj", "up_proj", "down_proj")
LLAMA_MODULES = ATTENTION_MODULES + MLP_MODULES
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}
# slots beyond the pinned and warm ones, as a share of the other adapters in production:
# the working set of a fleet whose traffic is spread over many tenants. At least one, so an
# adapter that is neither pinned nor warm is never left without a slot to be loaded into
WORKING_SET_HEADROOM = 0.25
# what a replica is started with when the plan asks for less (the defaults before plans)
DEFAULT_MAX_LORAS = 4
DEFAULT_MAX_LORA_RANK = 16


@dataclass(frozen=True)
class BaseShape:
    """The dimensions of a LLaMA-style base that size a LoRA adapter on it."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    dtype: str

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> BaseShape:
        """The shape ``config.json`` describes (``num_key_value_heads`` defaults to the
        heads, ``head_dim`` to hidden / heads, the dtype to float32).

        Raises:
            InvalidInput: INVALID_BASE naming the key that is missing or not a positive
                integer, or a dtype of unknown size.
        """

        def positive(key: str, default: int | None = None) -> int:
            value = config.get(key, default)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidInput(
                    f"config.json {key} is {value!r}, not a positive integer",
                    code=ErrorCode.INVALID_BASE,
                    field=key,
                )
            return value

        heads = positive("num_attention_heads")
        hidden = positive("hidden_size")
        dtype = config.get("torch_dtype") or config.get("dtype") or "float32"
        if dtype not in DTYPE_BYTES:
            raise InvalidInput(
                f"config.json torch_dtype {dtype!r} is not one of {sorted(DTYPE_BYTES)}",
                code=ErrorCode.INVALID_BASE,
                field="torch_dtype",
            )
        return cls(
            hidden_size=hidden,
            intermediate_size=positive("intermediate_size"),
            num_layers=positive("num_hidden_layers"),
            num_heads=heads,
            num_kv_heads=positive("num_key_value_heads", heads),
            head_dim=positive("head_dim") if config.get("head_dim") is not None else hidden // heads,
            dtype=dtype,
        )

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    def dims(self, module: str) -> tuple[int, int]:
        """(in, out) features of one target module.

        Raises:
            InvalidInput: MANIFEST_MISMATCH naming a module a LLaMA-style layer does not have.
        """
        attention, kv = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        dims = {
            "q_proj": (self.hidden_size, attention),
            "k_proj": (self.hidden_size, kv),
            "v_proj": (self.hidden_size, kv),
            "o_proj": (attention, self.hidden_size),
            "gate_proj": (self.hidden_size, self.intermediate_size),
            "up_proj": (self.hidden_size, self.intermediate_size),
            "down_proj": (self.intermediate_size, self.hidden_size),
        }
        if module not in dims:
            raise _unknown_module(module)
        return dims[module]


def _unknown_module(module: str) -> InvalidInput:
    return InvalidInput(
        f"target module {module!r} is not one of a LLaMA-style base's {list(LLAMA_MODULES)}: "
        "its memory cannot be planned",
        code=ErrorCode.MANIFEST_MISMATCH,
        field="target_modules",
    )


def targeted_layers(target_modules: Sequence[str] | str, num_layers: int) -> dict[str, int]:
    """Module name -> in how many layers an adapter targets it. A list targets each module
    in every layer; a regular expression targets the module paths it matches in full, as
    PEFT applies it.

    Raises:
        InvalidInput: MANIFEST_MISMATCH naming an unknown module, or a regular expression
            that matches no module of a LLaMA-style base.
    """
    if not isinstance(target_modules, str):
        unknown = [m for m in target_modules if m not in LLAMA_MODULES]
        if unknown:
            raise _unknown_module(unknown[0])
        return {module: num_layers for module in target_modules}
    counts: dict[str, int] = {}
    for layer in range(num_layers):
        for module in LLAMA_MODULES:
            block = "self_attn" if module in ATTENTION_MODULES else "mlp"
            if re.fullmatch(target_modules, f"model.layers.{layer}.{block}.{module}"):
                counts[module] = counts.get(module, 0) + 1
    if not counts:
        raise InvalidInput(
            f"target_modules {target_modules!r} matches no module of a LLaMA-style base: its memory cannot be planned",
            code=ErrorCode.MANIFEST_MISMATCH,
            field="target_modules",
        )
    return counts


def adapter_bytes(shape: BaseShape, rank: int, target_modules: Sequence[str] | str) -> int:
    """Host memory of one adapter (its entry in the replica's CPU cache): per targeted
    module and layer, A (rank x in) and B (out x rank) -- layers x sum of rank x (in + out)
    x dtype bytes for a list of modules."""
    layers = targeted_layers(target_modules, shape.num_layers)
    return sum(n * rank * sum(shape.dims(m)) for m, n in layers.items()) * shape.dtype_bytes


def slot_bytes(shape: BaseShape, max_lora_rank: int) -> int:
    """Accelerator memory of one of a replica's ``max_loras`` slots: every LoRA-capable
    module of every layer at ``max_lora_rank``, whichever adapter fills it."""
    return adapter_bytes(shape, max_lora_rank, LLAMA_MODULES)


def human_bytes(count: int | None) -> str:
    """1536 -> "1.5 KiB"; None -> "unknown"."""
    if count is None:
        return "unknown"
    if count < 1024:
        return f"{count} B"
    value, units = count / 1024, ["KiB", "MiB", "GiB", "TiB"]
    while value >= 1024 and len(units) > 1:
        value, units = value / 1024, units[1:]
    return f"{value:.1f} {units[0]}"


def rank_for(rank: int, accepted: Sequence[int]) -> int:
    """The smallest ``--max-lora-rank`` vLLM accepts that holds ``rank``, at least the
    default; the largest accepted one when none does (the plan then refuses it)."""
    fitting = [r for r in sorted(accepted) if r >= max(rank, DEFAULT_MAX_LORA_RANK)]
    return fitting[0] if fitting else max(accepted)


class Residence(StrEnum):
    SERVED = "served"  # under the plain name: production (a canary replica: its canary)
    WARM = "warm"  # as name@version beside it: an active window's canary, the previous production


@dataclass(frozen=True)
class ResidentVersion:
    """One version a replica of the plan's role keeps resident, with what sizes it."""

    name: str
    version_id: str
    residence: Residence
    lora_rank: int
    target_modules: tuple[str, ...] | str
    bytes: int | None = None  # None: the base's shape could not be read

    def as_dict(self) -> dict[str, Any]:
        targets = self.target_modules if isinstance(self.target_modules, str) else list(self.target_modules)
        return {
            "name": self.name,
            "version_id": self.version_id,
            "residence": self.residence.value,
            "lora_rank": self.lora_rank,
            "target_modules": targets,
            "bytes": self.bytes,
            "size": human_bytes(self.bytes),
        }


def resident_set(
    role: ReplicaRole, adapters: Iterable[AdapterPointers], windows: Mapping[str, str]
) -> list[tuple[str, str, Residence]]:
    """(name, version, residence) of every version a replica of ``role`` keeps: what it
    serves under each plain name and, on production, each adapter's ``warm_versions``
    (``windows``: adapter name -> the version of its open or ready window)."""
    found = []
    for pointers in adapters:
        served = served_version(role, pointers)
        if served is not None:
            found.append((pointers.name, served, Residence.SERVED))
        if role == ReplicaRole.PRODUCTION:
            warm = warm_versions(pointers, windows.get(pointers.name)) - {served}
            found.extend((pointers.name, v, Residence.WARM) for v in sorted(warm))
    return found


@dataclass(frozen=True)
class Shortfall:
    """Why a replica's configuration does not hold a plan: the setting and one line."""

    field: str
    message: str


@dataclass(frozen=True)
class ResidencyPlan:
    """What replicas of one base in one role must hold (module docstring)."""

    base_model_id: str
    role: ReplicaRole
    residents: tuple[ResidentVersion, ...]
    pinned: int = 0  # served adapters that never leave a slot (adapter_pins: rules/pinning.py)
    shape: BaseShape | None = None  # None: memory is not planned (``shape_note`` says why)
    shape_note: str = ""
    headroom_fraction: float = WORKING_SET_HEADROOM
    accepted_ranks: tuple[int, ...] = field(default=(DEFAULT_MAX_LORA_RANK,))

    @property
    def served(self) -> tuple[ResidentVersion, ...]:
        return tuple(r for r in self.residents if r.residence == Residence.SERVED)

    @property
    def warm(self) -> tuple[ResidentVersion, ...]:
        return tuple(r for r in self.residents if r.residence == Residence.WARM)

    @property
    def floor(self) -> int:
        """Slots no replica of the role may have fewer of: pinned + warm."""
        return self.pinned + len(self.warm)

    @property
    def headroom(self) -> int:
        """Working-set slots for the served adapters that are not pinned."""
        rest = max(0, len(self.served) - self.pinned)
        return min(rest, max(1, math.ceil(self.headroom_fraction * rest))) if rest else 0

    @property
    def max_loras(self) -> int:
        """Slots the plan needs: pinned + warm + headroom (never more than it keeps)."""
        return self.floor + self.headroom

    @property
    def max_cpu_loras(self) -> int:
        """Cache entries: every served version and warm copy, so none is read from disk again."""
        return len(self.residents)

    @property
    def max_rank(self) -> int:
        return max((r.lora_rank for r in self.residents), default=0)

    @property
    def cpu_bytes(self) -> int | None:
        if any(r.bytes is None for r in self.residents):
            return None
        return sum(r.bytes or 0 for r in self.residents)

    def slot_bytes(self, max_lora_rank: int) -> int | None:
        return slot_bytes(self.shape, max_lora_rank) if self.shape is not None else None

    def settings(self) -> dict[str, int]:
        """What to start a replica of the role with: the plan, and never less than the
        defaults (an empty fleet starts as before: 4 slots, 16 cache entries, rank 16). The
        cache keeps 4 x max_loras when that is more (``default_max_cpu_loras``: unload frees
        only the front end's entry, so each switch leaves one in the worker's cache)."""
        max_loras = max(self.max_loras, DEFAULT_MAX_LORAS)
        return {
            "max_loras": max_loras,
            "max_cpu_loras": max(self.max_cpu_loras, 4 * max_loras),
            "max_lora_rank": rank_for(self.max_rank, self.accepted_ranks),
        }

    def refusals(self, max_loras: int, max_lora_rank: int) -> list[Shortfall]:
        """What makes a replica unable to serve the plan at all: fewer slots than pinned +
        warm, or a rank limit below a resident version's rank."""
        found = []
        if max_loras < self.floor:
            found.append(
                Shortfall(
                    "max_loras",
                    f"max_loras {max_loras} cannot hold the {self.floor} adapter(s) a {self.role.value} replica of "
                    f"{self.base_model_id} keeps in slots ({self.pinned} pinned + {len(self.warm)} warm)",
                )
            )
        over = sorted({r.lora_rank for r in self.residents if r.lora_rank > max_lora_rank})
        if over:
            names = sorted({r.name for r in self.residents if r.lora_rank > max_lora_rank})
            found.append(
                Shortfall(
                    "max_lora_rank",
                    f"max_lora_rank {max_lora_rank} is below rank {over[-1]} of {', '.join(names[:3])}"
                    + (f" and {len(names) - 3} more" if len(names) > 3 else ""),
                )
            )
        return found

    def shortfalls(self, max_loras: int, max_lora_rank: int, max_cpu_loras: int | None) -> list[Shortfall]:
        """Everything short of the plan: the refusals, fewer slots than it needs, and a
        cache smaller than what it keeps (``max_cpu_loras`` None: not known, not checked)."""
        found = self.refusals(max_loras, max_lora_rank)
        if max_loras >= self.floor and max_loras < self.max_loras:
            found.append(
                Shortfall(
                    "max_loras",
                    f"max_loras {max_loras} < {self.max_loras} needed ({self.floor} pinned + warm "
                    f"+ {self.headroom} working set)",
                )
            )
        if max_cpu_loras is not None and max_cpu_loras < self.max_cpu_loras:
            found.append(
                Shortfall(
                    "max_cpu_loras",
                    f"max_cpu_loras {max_cpu_loras} < {self.max_cpu_loras} versions kept: some are read from disk",
                )
            )
        return found

    def as_dict(self) -> dict[str, Any]:
        return {
            "base_model_id": self.base_model_id,
            "role": self.role.value,
            "served": len(self.served),
            "warm": len(self.warm),
            "pinned": self.pinned,
            "max_loras": self.max_loras,
            "max_cpu_loras": self.max_cpu_loras,
            "max_rank": self.max_rank,
            "cpu_bytes": self.cpu_bytes,
            "memory_note": self.shape_note or None,
            "settings": self.settings(),
            "residents": [r.as_dict() for r in self.residents],
        }
