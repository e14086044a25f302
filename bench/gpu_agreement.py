"""Does a GPU read the same greedy completions off an adapter as shadow validation did here?

Shadow validation records, on this CPU in float32 with eager attention, the greedy
completions of an adapter's golden set; the fleet then checks that each replica answers the
same. A GPU fleet computes in other kernels, and often in bfloat16: this measures how much of
a golden set a GPU reproduces token for token, per dtype and attention kernel, against the
CPU in the same pack (the peer), and how far the first step's logits move.

Two steps, because the GPU machine has torch, transformers and PEFT but not loragate's
dependencies and no network:

- ``python -m bench.gpu_agreement prepare DIR`` (here): the kit's tiny base and two trained
  adapters (support, tickets), their golden prompts, and this CPU's completions and first-step
  logits as shadow validation computes them (``loragate.tasks.validation.greedy``), into DIR;
- ``python bench/gpu_agreement.py compare DIR`` (there, or here): the same completions on every
  device and dtype torch offers, compared with the pack's; prints JSON.

The greedy decoding is validation's own module, loaded by its path so that nothing else of
loragate is imported.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import shutil
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

TASKS = ("support", "tickets")
GREEDY = Path(__file__).resolve().parents[1] / "loragate" / "tasks" / "validation" / "greedy.py"


def _greedy_module(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location("loragate_greedy", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while defined
    spec.loader.exec_module(module)
    return module


def _complete(model: Any, tokenizer: Any, cases: list[dict[str, Any]], device: str, greedy: Any) -> dict[str, Any]:
    import torch

    enc = tokenizer([c["prompt"] for c in cases], return_tensors="pt", padding=True).to(device)
    spec = [SimpleNamespace(id=c["id"], max_tokens=c["max_tokens"]) for c in cases]
    out = greedy.greedy_completions(model, tokenizer, enc, spec, max(c["max_tokens"] for c in cases))
    first = out.step_logits[0].float().cpu()
    top2 = torch.stack([s.float().cpu() for s in out.step_logits], dim=1).topk(2, dim=-1).values
    gaps = (top2[..., 0] - top2[..., 1]).tolist()  # [case, step]: how far greedy's pick led
    decided = [gaps[i][: out.decided[c["id"]]] for i, c in enumerate(cases)]
    return {
        "token_ids": out.token_ids,
        "texts": out.texts,
        "first_logits": first.tolist(),
        "min_margin": min((g for row in decided for g in row), default=0.0),
    }


def _load(base: Path, adapter: Path, device: str, dtype: str, attention: str) -> tuple[Any, Any]:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(base, attn_implementation=attention, dtype=getattr(torch, dtype))
    model = PeftModel.from_pretrained(model, adapter).to(device).eval()
    return model, tokenizer


def prepare(out: Path) -> None:
    """The pack: base, adapters, golden prompts and this CPU's completions (float32, eager)."""
    from kit.basekit import build_base
    from kit.modelkit import train_adapter
    from kit.tenant_tasks import golden_set

    out.mkdir(parents=True, exist_ok=True)
    work = out / "work"
    base = build_base(work / "tiny-llama")
    shutil.copytree(base, out / "base", dirs_exist_ok=True)
    greedy = _greedy_module(GREEDY)
    pack: dict[str, Any] = {"reference": {"machine": platform.node(), "dtype": "float32", "attention": "eager"}}
    for task in TASKS:
        bundle = train_adapter(base, task, work / task)
        shutil.copytree(bundle, out / task, dirs_exist_ok=True)
        cases = [{"id": c.id, "prompt": c.prompt, "max_tokens": c.max_tokens} for c in golden_set(task).cases]
        model, tokenizer = _load(out / "base", out / task, "cpu", "float32", "eager")
        pack[task] = {"cases": cases, "cpu": _complete(model, tokenizer, cases, "cpu", greedy)}
    shutil.rmtree(work)
    (out / "pack.json").write_text(json.dumps(pack))


def compare(pack_dir: Path) -> dict[str, Any]:
    """Every device and dtype torch offers against the pack's CPU completions."""
    import torch
    import transformers

    pack = json.loads((pack_dir / "pack.json").read_text())
    greedy = _greedy_module(pack_dir / "greedy.py" if (pack_dir / "greedy.py").exists() else GREEDY)
    runs = [("cpu", "float32", "eager")]
    if torch.cuda.is_available():
        runs += [(d, a) for d in ("float32", "bfloat16", "float16") for a in ("eager", "sdpa")]
        runs = [("cpu", "float32", "eager")] + [("cuda", d, a) for d, a in runs[1:]]
    results = []
    for device, dtype, attention in runs:
        for task in TASKS:
            reference, cases = pack[task]["cpu"], pack[task]["cases"]
            started = time.perf_counter()
            model, tokenizer = _load(pack_dir / "base", pack_dir / task, device, dtype, attention)
            got = _complete(model, tokenizer, cases, device, greedy)
            same_tokens = sum(got["token_ids"][c["id"]] == reference["token_ids"][c["id"]] for c in cases)
            drift = (torch.tensor(got["first_logits"]) - torch.tensor(reference["first_logits"])).abs().max()
            results.append(
                {
                    "device": device,
                    "dtype": dtype,
                    "attention": attention,
                    "task": task,
                    "cases": len(cases),
                    "same_completion": same_tokens,
                    "agreement": round(same_tokens / len(cases), 4),
                    "first_logits_max_abs_diff": float(drift),
                    "reference_min_margin": round(reference["min_margin"], 3),
                    "seconds": round(time.perf_counter() - started, 2),
                }
            )
    return {
        "benchmark": "gpu_agreement",
        "reference": pack["reference"],
        "machine": {
            "node": platform.node(),
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        },
        "runs": results,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("step", choices=("prepare", "compare"))
    parser.add_argument("dir", type=Path)
    args = parser.parse_args()
    if args.step == "prepare":
        prepare(args.dir)
        shutil.copy(GREEDY, args.dir / "greedy.py")
        return
    json.dump(compare(args.dir), sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
