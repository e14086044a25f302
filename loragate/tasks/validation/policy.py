"""What the gate demands of an adapter, taken from the settings at the start of a run."""

from __future__ import annotations

from dataclasses import dataclass

from loragate.registry.errors import ErrorCode, InvalidInput
from loragate.registry.settings import Settings


@dataclass(frozen=True)
class ValidationPolicy:
    # golden pass rate needed
    pass_threshold: float
    # the serving fleet's --max-lora-rank
    max_lora_rank: int
    # the largest |logit change| an adapter may cause and still count as doing nothing
    noop_tolerance: float
    device: str
    hf_cache_dir: str | None
    # the largest drop in pass rate, overall or on a slice, against production
    regression_epsilon: float = 0.0
    # adaptersentry's policy, and the concentration z past which loragate blocks
    scan_policy: str = "strict"
    scan_block_z: float | None = None
    # off only for bench/validation.py's baseline (the gate without the scan): the
    # settings have no way to turn it off
    scan_weights: bool = True

    @classmethod
    def from_settings(
        cls, settings: Settings, *, pass_threshold: float | None = None, regression_epsilon: float | None = None
    ) -> ValidationPolicy:
        """The policy the settings define; ``pass_threshold`` and ``regression_epsilon``
        override theirs (``--threshold``, ``--regression-epsilon``).

        Raises:
            InvalidInput: INVALID_SETTING for a threshold or an epsilon outside [0, 1].
        """
        threshold = settings.validation_threshold if pass_threshold is None else pass_threshold
        if not 0.0 <= threshold <= 1.0:
            raise InvalidInput(
                f"threshold {threshold} is not in [0, 1]", code=ErrorCode.INVALID_SETTING, field="threshold"
            )
        epsilon = settings.regression_epsilon if regression_epsilon is None else regression_epsilon
        if not 0.0 <= epsilon <= 1.0:
            raise InvalidInput(
                f"regression epsilon {epsilon} is not in [0, 1]",
                code=ErrorCode.INVALID_SETTING,
                field="regression_epsilon",
            )
        return cls(
            pass_threshold=threshold,
            max_lora_rank=settings.max_lora_rank,
            noop_tolerance=settings.noop_tolerance,
            device=settings.validation_device,
            hf_cache_dir=settings.hf_cache_dir,
            regression_epsilon=epsilon,
            scan_policy=settings.scan_policy,
            scan_block_z=settings.scan_block_z,
        )
