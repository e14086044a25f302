"""What keeping adapters' deltas off the base's rows costs (docs/benchmarks/fallback-bytes.md):
vLLM 0.32's CPU LoRA ops against the plugin's (``loragate_resolver.cpu_lora_ops``), one shrink
and one expand over a batch whose rows are spread over the slots and the base (-1), on one
thread, alternated, at the tiny base's width and at SmolLM2-135M's.

Runs in the replicas' venv (it needs vLLM):

    .venv-vllm/bin/python -m bench.cpu_lora_ops [--repeats 300] [--smoke] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "infra" / "vllm_plugin"))

# (width, rank, slots, rows): the tiny base at 2 slots and 64 rows; SmolLM2-135M's 576 at 16 slots
SHAPES = [(128, 16, 2, 64), (576, 16, 16, 256)]


def timed(ops: Any, shape: tuple[int, int, int, int], repeats: int) -> float:
    """Microseconds for one shrink and one expand, the median of ``repeats`` runs."""
    import torch

    width, rank, slots, rows = shape
    generator = torch.Generator().manual_seed(0)
    lora_a = torch.randn(slots, 1, rank, width, generator=generator)
    lora_b = torch.randn(slots, 1, width, rank, generator=generator)
    x = torch.randn(rows, width, generator=generator)
    indices = torch.randint(-1, slots, (rows,), generator=generator)
    shrunk, out = torch.zeros(rows, rank), torch.zeros(rows, width)
    times = []
    for i in range(repeats + 10):
        t = time.perf_counter()
        ops.bgmv_shrink(x, lora_a, shrunk, indices, 1.0)
        ops.bgmv_expand(shrunk, lora_b, out, indices, True)
        if i >= 10:
            times.append(time.perf_counter() - t)
    return round(sorted(times)[len(times) // 2] * 1e6, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=300)
    parser.add_argument("--smoke", action="store_true", help="10 repeats")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    import torch
    from loragate_resolver import cpu_lora_ops
    from vllm.lora.ops.torch_ops import lora_ops

    torch.set_num_threads(1)
    repeats = 10 if args.smoke else args.repeats
    rows = []
    for shape in SHAPES:
        vllm_us, guarded_us = [], []
        for _ in range(3):  # alternated: a busy moment falls on both
            vllm_us.append(timed(lora_ops, shape, repeats))
            guarded_us.append(timed(cpu_lora_ops, shape, repeats))
        width, rank, slots, n = shape
        v, g = sorted(vllm_us)[1], sorted(guarded_us)[1]
        rows.append(
            {
                "width": width,
                "rank": rank,
                "slots": slots,
                "rows": n,
                "vllm_us": v,
                "guarded_us": g,
                "ratio": round(g / v, 3) if v else None,
            }
        )
    result = {
        "benchmark": "cpu_lora_ops",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "repeats": repeats,
        "shapes": rows,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
