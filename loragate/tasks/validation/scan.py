"""Static weight scan: adaptersentry reads the adapter's weights before anything loads.

adaptersentry computes the exact statistics of each module's update ΔW = s·B·A and
compares every module with its own family inside the adapter (all ``q_proj``, all
``down_proj``, ...); a module whose update is concentrated on a few outputs, unlike its
family, is the pattern of a planted behaviour that a small golden set never triggers.
Its verdict is ``allow``, ``review`` or ``block`` with reasons. loragate takes it as it
is, and may raise a ``review`` to ``block`` past a concentration z the operator sets
(``LORAGATE_SCAN_BLOCK_Z``): adaptersentry itself never blocks on that pattern without a
reference profile of the model family, since the false-positive rate of a block would be
unknown. The comparison needs at least 16 modules per family; on shallower bases the
verdict says so in its limits.
"""

from __future__ import annotations

from pathlib import Path

from loragate.registry.records.reports import ScanReason, WeightScan
from loragate.tasks.validation.policy import ValidationPolicy

BLOCK_Z_CODE = "LORAGATE_SCAN_BLOCK_Z"


def scan_weights(weights_path: Path, policy: ValidationPolicy) -> WeightScan:
    """adaptersentry's verdict on one ``adapter_model.safetensors`` (its
    ``adapter_config.json`` beside it gives the scale). Never raises: a file it cannot
    analyse is a ``review`` (adaptersentry fails closed)."""
    from adaptersentry import __version__, scan

    result = scan(Path(weights_path), policy=policy.scan_policy)
    verdict = result.verdict
    intra = result.anomaly.intra if result.anomaly is not None else None
    z = intra.max_concentration_z if intra is not None else None
    action = str(verdict.action)
    reasons = [ScanReason(code=r.code, message=r.message) for r in verdict.reasons]
    if policy.scan_block_z is not None and z is not None and z >= policy.scan_block_z and action != "block":
        action = "block"
        reasons.append(
            ScanReason(
                code=BLOCK_Z_CODE,
                message=f"concentration z {z:.1f} >= {policy.scan_block_z:g}, the block threshold set for this fleet",
            )
        )
    return WeightScan(
        action=action,
        level=str(getattr(verdict.level, "value", verdict.level)),
        confidence=str(verdict.confidence.level),
        reasons=reasons,
        limits=list(verdict.confidence.limiting_factors),
        max_concentration_z=z,
        scanner=f"adaptersentry {__version__}",
        policy=policy.scan_policy,
        wall_time_s=round(result.scan.wall_time_ms / 1000, 4),
    )
