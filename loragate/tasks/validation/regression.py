"""Regression against production: the candidate's golden results next to production's.

Both versions run the same golden set on the same loaded base, so the only difference is
the adapter. Pass rates are compared overall and per slice (each ``key=value`` of the
cases' ``slice`` objects, and their combinations); a slice regresses when its pass rate
drops by more than epsilon. For each regressed slice the report names the cases
production gets right and the candidate gets wrong, and the word n-grams their prompts
share that the rest of the set does not -- a hint at what kind of request broke, found
without a model.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from loragate.registry.intake.golden import GoldenCase
from loragate.registry.records.reports import CommonNgram, Regression, SliceChange

MAX_NGRAM = 3
TOP_NGRAMS = 3
# pass rates are ratios of small integers: compare them with a margin for float rounding
_RATE_SLACK = 1e-9
_WORD = re.compile(r"\w+", re.UNICODE)


def skipped(reason: str, epsilon: float, production_version: str | None = None) -> Regression:
    return Regression(production_version=production_version, epsilon=epsilon, skipped=reason)


def _words(prompt: str) -> list[str]:
    return _WORD.findall(prompt.lower())


def _ngrams(words: list[str], template: set[str]) -> set[str]:
    grams = set()
    for n in range(1, MAX_NGRAM + 1):
        for i in range(len(words) - n + 1):
            gram = words[i : i + n]
            if not template.intersection(gram):
                grams.add(" ".join(gram))
    return grams


def common_ngrams(failing: Sequence[str], others: Sequence[str], top: int = TOP_NGRAMS) -> list[CommonNgram]:
    """The word n-grams (1 to 3 words) most typical of the ``failing`` prompts.

    Words in every prompt are the template and never part of one. An n-gram scores the
    share of failing prompts containing it minus the share of the other prompts
    containing it; it must be in at least two failing prompts (or the only one). Longer n-grams win ties,
    an n-gram inside a better one with the same counts is left out as redundant, and so is
    one scoring half the best or less.
    """
    if not failing:
        return []
    failing_words, other_words = [_words(p) for p in failing], [_words(p) for p in others]
    template = set.intersection(*(set(w) for w in failing_words + other_words))
    in_failing: Counter[str] = Counter(g for w in failing_words for g in _ngrams(w, template))
    in_others: Counter[str] = Counter(g for w in other_words for g in _ngrams(w, template))
    needed = min(2, len(failing))

    def score(g: str) -> float:
        return in_failing[g] / len(failing) - (in_others[g] / len(others) if others else 0.0)

    candidates = [g for g in in_failing if in_failing[g] >= needed and score(g) > 0]
    candidates.sort(key=lambda g: (-score(g), -len(g.split()), -in_failing[g], g))
    chosen: list[str] = []
    for g in candidates:
        if score(g) <= score(candidates[0]) / 2:
            break  # far less typical than the best: noise, not a pattern
        subsumed = any(
            f" {g} " in f" {c} " and in_failing[c] == in_failing[g] and in_others[c] == in_others[g] for c in chosen
        )
        if not subsumed:
            chosen.append(g)
        if len(chosen) == top:
            break
    return [CommonNgram(text=g, failing=in_failing[g], others=in_others[g]) for g in chosen]


def _change(
    label: str,
    cases: Sequence[GoldenCase],
    everyone: Sequence[GoldenCase],
    candidate: Mapping[str, bool],
    production: Mapping[str, bool],
    epsilon: float,
) -> SliceChange:
    before = sum(production[c.id] for c in cases) / len(cases)
    after = sum(candidate[c.id] for c in cases) / len(cases)
    broken = [c for c in cases if production[c.id] and not candidate[c.id]]
    broken_ids = {c.id for c in broken}
    return SliceChange(
        slice=label,
        cases=len(cases),
        before=before,
        after=after,
        regressed=before - after > epsilon + _RATE_SLACK,
        failing_cases=[c.id for c in broken],
        common_ngrams=common_ngrams([c.prompt for c in broken], [c.prompt for c in everyone if c.id not in broken_ids]),
    )


def slices_of(cases: Iterable[GoldenCase]) -> dict[str, list[GoldenCase]]:
    """Every slice label of the set with its cases, in label order."""
    groups: dict[str, list[GoldenCase]] = {}
    for case in cases:
        for label in case.slice_labels:
            groups.setdefault(label, []).append(case)
    return dict(sorted(groups.items()))


def compare_with_production(
    cases: Sequence[GoldenCase],
    candidate: Mapping[str, bool],
    production: Mapping[str, bool],
    *,
    production_version: str,
    epsilon: float,
) -> Regression:
    """Pass rates of the candidate (``after``) against production (``before``), overall
    and per slice; regressed slices come first."""
    changes = [
        _change(label, members, cases, candidate, production, epsilon) for label, members in slices_of(cases).items()
    ]
    changes.sort(key=lambda c: not c.regressed)
    return Regression(
        production_version=production_version,
        epsilon=epsilon,
        overall=_change("overall", cases, cases, candidate, production, epsilon),
        slices=changes,
    )
