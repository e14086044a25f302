"""Settings: where the registry lives and the limits it enforces.

Read from the environment once, at the edge (the CLI, a flow's entry point), and passed
in from there; nothing below reads the environment itself. Defaults put everything under
``./.loragate/`` so that a fresh checkout works with no configuration.
"""

from __future__ import annotations

import getpass
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Mapping

from registry.errors import ErrorCode, InvalidInput

GIB = 1 << 30
MIB = 1 << 20

# vLLM accepts only these values for --max-lora-rank
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


@dataclass(frozen=True)
class Settings:
    home: Path = Path(".loragate")
    database_url: str = ""
    artifacts: str = ""
    s3_endpoint_url: str | None = None
    # where pinned Hugging Face bases are looked up; None: huggingface_hub's default
    hf_cache_dir: str | None = None
    # the serving fleet's --max-lora-rank; vLLM's own default is 16
    max_lora_rank: int = 16
    max_weights_bytes: int = 4 * GIB
    max_json_bytes: int = 1 * MIB
    golden_min_cases: int = 5
    validation_threshold: float = 0.8
    actor: str = field(default_factory=lambda: _default_actor())

    def __post_init__(self) -> None:
        if not self.database_url:
            object.__setattr__(self, "database_url", f"sqlite:///{self.home / 'registry.db'}")
        if not self.artifacts:
            object.__setattr__(self, "artifacts", str(self.home / "artifacts"))

    def with_(self, **changes) -> "Settings":
        return replace(self, **changes)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Settings":
        env = os.environ if env is None else env
        home = Path(env.get("LORAGATE_HOME", ".loragate"))
        kwargs: dict = {
            "home": home,
            "database_url": env.get("LORAGATE_DATABASE_URL", ""),
            "artifacts": env.get("LORAGATE_ARTIFACTS", ""),
            "s3_endpoint_url": env.get("LORAGATE_S3_ENDPOINT_URL") or None,
            "hf_cache_dir": env.get("HF_HUB_CACHE") or None,
        }
        if "LORAGATE_ACTOR" in env:
            kwargs["actor"] = env["LORAGATE_ACTOR"]
        ints = {
            "LORAGATE_MAX_LORA_RANK": "max_lora_rank",
            "LORAGATE_MAX_WEIGHTS_BYTES": "max_weights_bytes",
            "LORAGATE_MAX_JSON_BYTES": "max_json_bytes",
            "LORAGATE_GOLDEN_MIN_CASES": "golden_min_cases",
        }
        for var, attr in ints.items():
            if var in env:
                kwargs[attr] = _parse_int(var, env[var])
        if "LORAGATE_VALIDATION_THRESHOLD" in env:
            kwargs["validation_threshold"] = _parse_fraction(
                "LORAGATE_VALIDATION_THRESHOLD", env["LORAGATE_VALIDATION_THRESHOLD"]
            )
        settings = cls(**kwargs)
        settings.check()
        return settings

    def check(self) -> None:
        if self.max_lora_rank not in VLLM_LORA_RANKS:
            raise InvalidInput(
                f"max_lora_rank {self.max_lora_rank} is not one vLLM accepts {VLLM_LORA_RANKS}",
                code=ErrorCode.INVALID_SETTING,
                field="LORAGATE_MAX_LORA_RANK",
            )
        for attr in ("max_weights_bytes", "max_json_bytes", "golden_min_cases"):
            if getattr(self, attr) < 1:
                raise InvalidInput(
                    f"{attr} must be at least 1", code=ErrorCode.INVALID_SETTING, field=attr
                )
        if not self.actor:
            raise InvalidInput("actor is empty", code=ErrorCode.INVALID_SETTING, field="LORAGATE_ACTOR")


def _default_actor() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no passwd entry inside some containers
        return "unknown"


def _parse_int(var: str, raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise InvalidInput(f"{var}={raw!r} is not an integer", code=ErrorCode.INVALID_SETTING, field=var)


def _parse_fraction(var: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 1.0:
        raise InvalidInput(f"{var}={raw!r} is not a number in [0, 1]", code=ErrorCode.INVALID_SETTING, field=var)
    return value
