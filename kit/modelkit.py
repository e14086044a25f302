"""Offline model kit: LoRA adapters for the tiny base, trained in seconds on CPU.

The base is ``kit.basekit``'s and the tasks the adapters learn are ``kit.tenant_tasks``'s;
this module makes the adapters:

* ``train_adapter``: teaches one toy tenant task with PEFT LoRA (optionally QLoRA on a
  4-bit NF4 base), deterministically, and trains on until its golden set passes for real
  (judged as shadow validation judges it), or raises; writes a registrable bundle.
* ``golden_score``: how a model does on a task's golden set, the way shadow validation
  judges it; ``load_base`` loads the base the way shadow validation does.
* ``random_adapter``: an untrained adapter with non-zero B, for registry tests.
* ``save_bundle``: writes a PEFT model as a registrable bundle (weights, config, manifest).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from kit.basekit import BASE_ID, base_commit
from kit.tenant_tasks import TASKS, golden_cases, golden_set, prompt_for

DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# Training runs on a fixed thread count with deterministic algorithms: same arguments, same
# bytes, whatever the machine's core count (two threads: the numerics the fixtures were
# calibrated with on two cores). The golden set is checked after the steps asked for; a
# run that diverged falls back to its latest snapshot (one every ROUND_STEPS steps) that
# passes, and one that has not learned yet trains on in rounds of ROUND_STEPS up to
# MAX_STEPS. Every greedy token of a passing case must lead the runner-up by
# MIN_LOGIT_MARGIN (fully trained adapters have ~5-6), so another runtime's rounding
# (vLLM) cannot flip it.
TRAIN_THREADS = 2
ROUND_STEPS = 25
MAX_STEPS = 900
MIN_LOGIT_MARGIN = 2.0


def load_base(base_dir: Path, quantization_config: dict[str, Any] | None = None):
    """The base as shadow validation loads it (same dtype and bitsandbytes setup)."""
    from transformers import AutoModelForCausalLM

    from loragate.tasks.validation.session import base_load_kwargs

    return AutoModelForCausalLM.from_pretrained(
        base_dir, attn_implementation="eager", **base_load_kwargs(quantization_config)
    )


def _batch(tokenizer, task: str, queries: Collection[str] | None = None):
    import torch

    ids, labels = [], []
    for ex in TASKS[task]["examples"]:
        if queries is not None and ex.query not in queries:
            continue
        p = tokenizer(prompt_for(task, ex.query)).input_ids
        r = tokenizer(" " + ex.reply, add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
        ids.append(p + r)
        labels.append([-100] * len(p) + r)
    width = max(map(len, ids))
    pad = tokenizer.pad_token_id
    input_ids = torch.tensor([[pad] * (width - len(x)) + x for x in ids])
    label_ids = torch.tensor([[-100] * (width - len(x)) + x for x in labels])
    attention = (input_ids != pad).long()
    return input_ids, attention, label_ids


class GoldenSetNotLearned(RuntimeError):
    """``train_adapter`` spent its step budget without the adapter getting its golden set right."""

    def __init__(self, task: str, seed: int, steps: int, passed: int, total: int, margin: float, detail: str):
        self.task, self.seed, self.steps = task, seed, steps
        self.passed, self.total, self.margin = passed, total, margin
        super().__init__(
            f"train_adapter({task!r}, seed={seed}) did not learn its golden set in {steps} steps: "
            f"{passed}/{total} cases as expected, smallest greedy logit margin {margin:.2f} "
            f"(needs {MIN_LOGIT_MARGIN}); {detail}"
        )


@dataclass(frozen=True)
class GoldenScore:
    """How a model does on a task's golden set, judged the way shadow validation judges it."""

    passed: dict[str, bool]  # case id -> the greedy completion meets the case's expectation
    texts: dict[str, str]
    # per case, the smallest gap between the chosen token's logit and the runner-up's over
    # the completion (up to and including EOS): how far greedy decoding is from changing
    margins: dict[str, float]


@contextmanager
def deterministic_torch(seed: int, threads: int = TRAIN_THREADS) -> Iterator[None]:
    """Seeded RNG, ``threads`` intra-op threads and deterministic algorithms for the block;
    the caller's RNG state, thread count and determinism setting are restored afterwards."""
    import torch

    threads_before = torch.get_num_threads()
    deterministic_before = torch.are_deterministic_algorithms_enabled()
    warn_only_before = torch.is_deterministic_algorithms_warn_only_enabled()
    with torch.random.fork_rng(devices=[]):
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(True)
        torch.manual_seed(seed)
        try:
            yield
        finally:
            torch.use_deterministic_algorithms(deterministic_before, warn_only=warn_only_before)
            torch.set_num_threads(threads_before)


@cache
def _golden_set(task: str):
    return golden_set(task)


def golden_score(model, tokenizer, task: str) -> GoldenScore:
    """Greedy completions of ``task``'s golden set by ``model`` (a base, or a PEFT model with
    its adapter), decoded by shadow validation's own function
    (``loragate.tasks.validation.greedy``) and matched as it matches them
    (``loragate.registry.intake.golden.match_case``)."""
    import torch

    from loragate.registry.intake.golden import match_case
    from loragate.tasks.validation.greedy import greedy_completions

    golden = _golden_set(task)
    tokenizer.padding_side = "left"
    enc = tokenizer([c.prompt for c in golden.cases], return_tensors="pt", padding=True)
    was_training = model.training
    model.eval()
    try:
        greedy = greedy_completions(model, tokenizer, enc, golden.cases, golden.max_tokens)
    finally:
        model.train(was_training)
    logits = torch.stack([s.float() for s in greedy.step_logits], dim=1)  # [batch, steps, vocab]
    top2 = logits.topk(2, dim=-1).values
    gaps = (top2[..., 0] - top2[..., 1]).tolist()
    passed, margins = {}, {}
    for i, case in enumerate(golden.cases):
        passed[case.id] = match_case(case, greedy.texts[case.id])[0]
        margins[case.id] = min(gaps[i][: greedy.decided[case.id]], default=0.0)
    return GoldenScore(passed, greedy.texts, margins)


def _expected_cases(task: str, queries: Collection[str] | None) -> dict[str, bool]:
    """Which golden cases an adapter trained on ``queries`` (all the task's when None) gets right."""
    return {
        case["id"]: queries is None or ex.query in queries
        for case, ex in zip(golden_cases(task), TASKS[task]["examples"], strict=True)
    }


def train_adapter(
    base_dir: Path,
    task: str,
    dest: Path,
    *,
    rank: int = 8,
    alpha: int = 16,
    targets: tuple[str, ...] = DEFAULT_TARGETS,
    steps: int = 300,
    max_steps: int = MAX_STEPS,
    round_steps: int = ROUND_STEPS,
    until_golden: bool = True,
    lr: float = 5e-3,
    seed: int = 0,
    quantization_config: dict[str, Any] | None = None,
    base_model_id: str = BASE_ID,
    manifest_extra: dict[str, Any] | None = None,
    queries: Collection[str] | None = None,
) -> Path:
    """Train a LoRA adapter for ``task`` and write a registrable bundle to ``dest``;
    ``queries`` restricts training to those examples of the task.

    Training is deterministic (``TRAIN_THREADS`` threads, deterministic algorithms: same
    arguments, same bytes) and guarantees the golden set, decoded greedily and matched the
    way shadow validation does: every case trained on passes -- and every case not trained
    on fails -- with each greedy token ahead of the runner-up by ``MIN_LOGIT_MARGIN``.
    After ``steps`` steps the set is checked; if it does not pass, the latest snapshot
    (one every ``round_steps`` steps) that does is taken -- the run diverged after it --
    and failing that, training goes on in rounds of ``round_steps`` steps, checked after
    each, up to ``max_steps`` in all. Then it raises ``GoldenSetNotLearned`` naming the
    task, seed and score. ``until_golden=False`` trains exactly ``steps`` steps and checks
    nothing, for adapters meant to be something else."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoTokenizer

    expected = _expected_cases(task, queries)
    with deterministic_torch(seed):
        tokenizer = AutoTokenizer.from_pretrained(base_dir)
        base = load_base(base_dir, quantization_config)
        model = get_peft_model(
            base,
            LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(targets), lora_dropout=0.0, task_type="CAUSAL_LM"),
        )
        input_ids, attention, labels = _batch(tokenizer, task, queries)
        trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
        optimizer = torch.optim.AdamW(list(trainable.values()), lr=lr)
        model.train()
        losses: list[float] = []
        snapshots: dict[int, dict[str, Any]] = {}  # steps -> the trainable weights then

        def train(n: int) -> None:
            for _ in range(n):
                loss = model(input_ids=input_ids, attention_mask=attention, labels=labels).loss
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                losses.append(float(loss.detach()))
                if until_golden and len(losses) % round_steps == 0 and len(losses) < steps:
                    snapshots[len(losses)] = {k: p.detach().clone() for k, p in trainable.items()}

        train(steps)
        done, kept, checks, score = steps, steps, 0, None
        if until_golden:
            score, checks = golden_score(model, tokenizer, task), 1
            if not _learned(score, expected):
                final, final_score = {k: p.detach().clone() for k, p in trainable.items()}, score
                for at in sorted(snapshots, reverse=True):
                    _load_weights(trainable, snapshots[at])
                    score, checks = golden_score(model, tokenizer, task), checks + 1
                    if _learned(score, expected):
                        kept = at
                        break
                else:
                    _load_weights(trainable, final)
                    score = final_score
            while not _learned(score, expected) and done < max_steps:
                train(min(round_steps, max_steps - done))
                done = kept = len(losses)
                score, checks = golden_score(model, tokenizer, task), checks + 1
            if not _learned(score, expected):
                raise _not_learned(task, seed, done, score, expected, losses[-1] if losses else float("nan"))
    metadata: dict[str, Any] = {
        "task": task,
        "steps": kept,
        "lr": lr,
        "seed": seed,
        "final_loss": round(losses[kept - 1], 6) if kept else None,
    }
    if until_golden:
        metadata["golden_passed"] = sum(score.passed.values())
        metadata["golden_total"] = len(score.passed)
        metadata["golden_min_margin"] = round(
            min((score.margins[c] for c, want in expected.items() if want), default=0.0), 3
        )
        metadata["golden_checks"] = checks
        if kept < done:
            metadata["trained_steps"] = done  # the run diverged after ``steps``: the weights are earlier ones
    if queries is not None:
        metadata["queries"] = sorted(queries)
    return save_bundle(
        model,
        dest,
        base_model_id=base_model_id,
        base_model_commit=base_commit(base_dir),
        quantization_config=quantization_config,
        training_metadata=metadata,
        manifest_extra=manifest_extra,
    )


def _load_weights(params: dict[str, Any], weights: dict[str, Any]) -> None:
    import torch

    with torch.no_grad():
        for name, p in params.items():
            p.copy_(weights[name])


def _learned(score: GoldenScore, expected: dict[str, bool]) -> bool:
    return all(
        score.passed[cid] == want and (not want or score.margins[cid] >= MIN_LOGIT_MARGIN)
        for cid, want in expected.items()
    )


def _not_learned(
    task: str, seed: int, steps: int, score: GoldenScore, expected: dict[str, bool], loss: float
) -> GoldenSetNotLearned:
    wrong = [cid for cid, want in expected.items() if score.passed[cid] != want]
    thin = [
        cid for cid, want in expected.items() if want and score.passed[cid] and score.margins[cid] < MIN_LOGIT_MARGIN
    ]
    detail = ", ".join(
        [f"{cid} {'passes' if score.passed[cid] else 'fails'} ({score.texts[cid][:60]!r})" for cid in wrong]
        + [f"{cid} margin {score.margins[cid]:.2f}" for cid in thin]
    )
    margin = min((score.margins[cid] for cid, want in expected.items() if want), default=0.0)
    passed = sum(score.passed[cid] == want for cid, want in expected.items())
    return GoldenSetNotLearned(task, seed, steps, passed, len(expected), margin, f"final loss {loss:.4f}; {detail}")


def random_adapter(
    base_dir: Path,
    dest: Path,
    *,
    rank: int = 8,
    alpha: int = 16,
    targets: tuple[str, ...] = ("q_proj", "v_proj"),
    seed: int = 0,
    base_model_id: str = BASE_ID,
    manifest_extra: dict[str, Any] | None = None,
) -> Path:
    """An untrained adapter whose B is random (non-zero): registrable, not useful."""
    from peft import LoraConfig, get_peft_model

    with deterministic_torch(seed):
        base = load_base(base_dir)
        model = get_peft_model(
            base,
            LoraConfig(
                r=rank,
                lora_alpha=alpha,
                target_modules=list(targets),
                lora_dropout=0.0,
                task_type="CAUSAL_LM",
                init_lora_weights=False,
            ),
        )
    return save_bundle(
        model,
        dest,
        base_model_id=base_model_id,
        base_model_commit=base_commit(base_dir),
        training_metadata={"task": "random", "seed": seed},
        manifest_extra=manifest_extra,
    )


def save_bundle(
    model,
    dest: Path,
    *,
    base_model_id: str,
    base_model_commit: str,
    quantization_config: dict[str, Any] | None = None,
    training_metadata: dict[str, Any] | None = None,
    manifest_extra: dict[str, Any] | None = None,
) -> Path:
    dest = Path(dest)
    if dest.exists():
        shutil.rmtree(dest)
    model.save_pretrained(dest)
    (dest / "README.md").unlink(missing_ok=True)
    config_path = dest / "adapter_config.json"
    config = json.loads(config_path.read_text())
    # PEFT records the training-time directory; bind to the catalog id instead
    config["base_model_name_or_path"] = base_model_id
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True))
    manifest = {
        "base_model_id": base_model_id,
        "base_model_commit": base_model_commit,
        "lora_rank": config["r"],
        "lora_alpha": config["lora_alpha"],
        "lora_dropout": config["lora_dropout"],
        "target_modules": sorted(config["target_modules"]),
        "quantization_config": quantization_config,
        "adapter_checkpoint": "final",
        "training_git_commit": "0123456789abcdef0123456789abcdef01234567",
        "training_metadata": training_metadata or {},
        **(manifest_extra or {}),
    }
    (dest / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True))
    return dest


NF4 = {
    "load_in_4bit": True,
    "bnb_4bit_compute_dtype": "float32",
    "bnb_4bit_quant_type": "nf4",
    "bnb_4bit_use_double_quant": False,
}
