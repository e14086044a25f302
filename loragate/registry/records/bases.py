"""A base model as the catalog keeps it: the exact base an adapter must be bound to.

Built by intake from what it inspected (``intake/catalog.py``: the content digest of every
file, the canonical config hash, the RoPE settings, the tokenizer's digest, every 2-D
weight's shape) and read back by the store; plain frozen data, so every room may hold one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class BaseModelRecord:
    base_model_id: str
    base_model_commit: str
    source_kind: str  # "local" | "hf"
    source: str  # directory, or hub repo id
    content_digest: str
    config_sha256: str
    config_raw_sha256: str
    rope_scaling: dict[str, Any] | None
    tokenizer_revision: str
    transformers_version: str | None
    architecture: str | None
    module_shapes: dict[str, list[int]] = field(repr=False, default_factory=dict)
    created_at: datetime | None = None
    created_by: str | None = None

    @property
    def label(self) -> str:
        return f"{self.base_model_id}@{self.base_model_commit[:19]}"

    def binding_names(self) -> set[str]:
        """Spellings of this base accepted in adapter_config's base_model_name_or_path."""
        names = {self.base_model_id, self.source}
        if self.source_kind == "local":
            names.add(str(Path(self.source).resolve()))
        return names

    def summary(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("module_shapes")
        d["module_count"] = len(self.module_shapes)
        d["created_at"] = self.created_at.isoformat() if self.created_at else None
        return d
