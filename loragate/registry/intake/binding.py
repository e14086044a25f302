"""The binding of an adapter to its base: the one check register and validation share.

A manifest names the base it was trained on by id and commit, and may state facts about
that base (its canonical config hash, tokenizer digest, RoPE scaling). Each stated fact
must equal what the catalog pinned; register refuses the first mismatch, validation
reports them all. Binding fields a manifest leaves out are facts of the pinned base and
are filled from it at register.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from loragate.registry.intake.manifest import normalize_rope_scaling
from loragate.registry.records.bases import BaseModelRecord

# manifest field -> the catalog record's attribute it must equal
BINDING_FIELDS = {
    "base_model_id": "base_model_id",
    "base_model_commit": "base_model_commit",
    "base_config_sha256": "config_sha256",
    "tokenizer_revision": "tokenizer_revision",
    "rope_scaling": "rope_scaling",
}


@dataclass(frozen=True)
class BindingMismatch:
    field: str
    stated: Any
    pinned: Any

    def describe(self, base: BaseModelRecord) -> str:
        if self.field == "rope_scaling":
            return f"rope_scaling {self.stated} != pinned {self.pinned} of {base.label} (rope drift)"
        return f"{self.field} {_short(self.stated)} != pinned {_short(self.pinned)} of {base.label}"


def binding_mismatches(stated: Mapping[str, Any], base: BaseModelRecord) -> list[BindingMismatch]:
    """Every binding field present in ``stated`` that differs from the pinned ``base``."""
    mismatches = []
    for field, attribute in BINDING_FIELDS.items():
        if field not in stated:
            continue
        value, pinned = stated[field], getattr(base, attribute)
        if field == "rope_scaling":
            value = normalize_rope_scaling(value) if isinstance(value, Mapping) or value is None else value
        if value != pinned:
            mismatches.append(BindingMismatch(field, value, pinned))
    return mismatches


def _short(value: Any) -> str:
    text = repr(value) if not isinstance(value, str) else value
    return text if len(text) <= 23 else text[:19] + "..."
