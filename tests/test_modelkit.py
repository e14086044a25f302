"""The model kit's guarantee: a trained adapter passes its golden set, the same bytes every time."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from kit import modelkit


def _sha256(bundle: Path) -> str:
    return hashlib.sha256((bundle / "adapter_model.safetensors").read_bytes()).hexdigest()


def _metadata(bundle: Path) -> dict:
    return json.loads((bundle / "manifest.json").read_text())["training_metadata"]


def test_training_goes_on_in_rounds_until_the_golden_set_passes_and_repeats_byte_for_byte(tiny_base, tmp_path):
    import torch
    from peft import PeftModel
    from transformers import AutoTokenizer

    threads = torch.get_num_threads()
    # one step teaches nothing: the rounds after it do the work
    first = modelkit.train_adapter(tiny_base, "support", tmp_path / "first", seed=7, steps=1, round_steps=25)
    meta = _metadata(first)
    assert meta["golden_checks"] > 1 and meta["steps"] == 1 + 25 * (meta["golden_checks"] - 1)
    assert meta["golden_passed"] == meta["golden_total"] == 8
    assert meta["golden_min_margin"] >= modelkit.MIN_LOGIT_MARGIN
    assert torch.get_num_threads() == threads and not torch.are_deterministic_algorithms_enabled(), "restored"

    # the bundle on disk, loaded by PEFT, gets every case right with a margin
    model = PeftModel.from_pretrained(modelkit.load_base(tiny_base), first)
    score = modelkit.golden_score(model, AutoTokenizer.from_pretrained(tiny_base), "support")
    assert all(score.passed.values()), score.texts
    assert min(score.margins.values()) >= modelkit.MIN_LOGIT_MARGIN

    again = modelkit.train_adapter(tiny_base, "support", tmp_path / "again", seed=7, steps=1, round_steps=25)
    assert _sha256(again) == _sha256(first)
    assert (again / "manifest.json").read_bytes() == (first / "manifest.json").read_bytes()


def test_a_run_that_fails_its_check_falls_back_to_its_latest_snapshot_that_passes(tiny_base, tmp_path, monkeypatch):
    real = modelkit.golden_score
    calls = []

    def diverged_at_the_end(model, tokenizer, task):
        score = real(model, tokenizer, task)
        calls.append(score)
        if len(calls) == 1:  # the check after the steps asked for: as if the loss had spiked
            return modelkit.GoldenScore({c: False for c in score.passed}, score.texts, score.margins)
        return score

    monkeypatch.setattr(modelkit, "golden_score", diverged_at_the_end)
    rolled_back = modelkit.train_adapter(tiny_base, "support", tmp_path / "rolled-back", steps=100, round_steps=25)
    meta = _metadata(rolled_back)
    assert (meta["steps"], meta["trained_steps"], meta["golden_checks"]) == (75, 100, 2)
    monkeypatch.undo()
    # the snapshot is exactly what a run of 75 steps trains
    assert _sha256(rolled_back) == _sha256(modelkit.train_adapter(tiny_base, "support", tmp_path / "75", steps=75))


def test_an_adapter_that_does_not_learn_its_golden_set_fails_at_build_time_naming_task_seed_and_score(
    tiny_base, tmp_path
):
    with pytest.raises(modelkit.GoldenSetNotLearned) as failed:
        modelkit.train_adapter(tiny_base, "tickets", tmp_path / "short", seed=3, steps=1, max_steps=1)
    e = failed.value
    assert (e.task, e.seed, e.steps, e.total) == ("tickets", 3, 1, 8) and e.passed < e.total
    assert "train_adapter('tickets', seed=3)" in str(e) and f"{e.passed}/8 cases" in str(e)
    assert not (tmp_path / "short").exists(), "nothing written"

    # the opt-out trains exactly the steps asked for and checks nothing
    untrained = modelkit.train_adapter(tiny_base, "tickets", tmp_path / "as-is", seed=3, steps=1, until_golden=False)
    meta = _metadata(untrained)
    assert meta["steps"] == 1 and "golden_passed" not in meta
