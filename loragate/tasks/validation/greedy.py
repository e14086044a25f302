"""Greedy decoding of a golden set, done one way for everyone who judges an adapter by it.

Shadow validation (``session.BaseSession.generate``) and the model kit that trains the
adapters its tests expect to pass or fail (``kit``) must read the same completion off the
same model: one left-padded batch up to the set's ``max_tokens``, each case cut at its own
``max_tokens`` and at EOS, padding dropped. The logits of every step come back too, for
the checks that look at them and for the kit's margins.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: the GPU agreement check loads this module alone (bench/)
    from loragate.registry.intake.golden import GoldenCase


@dataclass(frozen=True)
class GreedyCompletions:
    token_ids: dict[str, list[int]]  # case id -> the completion's tokens, EOS and padding cut
    texts: dict[str, str]
    # case id -> how many tokens greedy chose that count: up to and including EOS, within the
    # case's max_tokens (where a changed token would change the completion)
    decided: dict[str, int]
    step_logits: tuple[Any, ...]  # one [batch, vocab] tensor per generated position


def greedy_completions(
    model: Any, tokenizer: Any, encodings: Any, cases: Sequence[GoldenCase], max_new_tokens: int
) -> GreedyCompletions:
    """Greedy completions of ``cases`` (in ``encodings``' order, left-padded) by ``model``."""
    import torch

    with torch.no_grad():
        out = model.generate(
            **encodings,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=tokenizer.pad_token_id,
        )
    width = encodings["input_ids"].shape[1]
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    token_ids, texts, decided = {}, {}, {}
    for case, row in zip(cases, out.sequences[:, width:].tolist(), strict=True):
        row = row[: case.max_tokens]
        decided[case.id] = len(row) if eos not in row else row.index(eos) + 1
        if eos in row:
            row = row[: row.index(eos)]
        row = [t for t in row if t != pad]
        token_ids[case.id] = row
        texts[case.id] = tokenizer.decode(row, skip_special_tokens=True)
    return GreedyCompletions(token_ids, texts, decided, tuple(out.logits))
