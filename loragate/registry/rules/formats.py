"""Format compliance: do live answers have the shape the golden set asks for?

A golden set *declares an output schema* when it has ``json_schema`` cases. Each production
replica keeps a bounded sample of every version's good non-streaming answer texts
(``samples`` in ``GET /loragate/traffic``; streamed answers are not sampled). A sampled
answer is *compliant* when its stripped text parses as JSON and satisfies at least one of
the set's schemas -- "at least one" because live prompts are not the golden prompts, so an
answer cannot be paired with its case, and a set with several schemas (one per kind of
request) accepts any of them. Without a schema compliance is not measured (None) and gates
nothing. The check runs on ``loragate.registry.rules.matching`` (RE2, no retrieval), like the golden
cases themselves.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from loragate.registry.rules.matching import MAX_COMPLETION_CHARS, schema_errors

FormatCheck = Callable[[str], bool]


class _Case(Protocol):
    @property
    def kind(self) -> str: ...

    @property
    def expected(self) -> Any: ...


class _Cases(Protocol):
    """What a golden set is to this rule (``intake/golden.py``'s ``GoldenSet``): its cases."""

    @property
    def cases(self) -> Sequence[_Case]: ...


def declared_schemas(golden: _Cases | None) -> list[dict[str, Any]]:
    """The distinct output schemas a golden set declares (its ``json_schema`` cases), in
    case order; none for no set."""
    if golden is None:
        return []
    seen: dict[str, dict[str, Any]] = {}
    for case in golden.cases:
        if case.kind == "json_schema" and isinstance(case.expected, dict):
            seen.setdefault(json.dumps(case.expected, sort_keys=True), case.expected)
    return list(seen.values())


def schema_check(schemas: Iterable[dict[str, Any]]) -> FormatCheck | None:
    """A check of one answer text against any of ``schemas``; None when there are none (not
    measured). Never raises: malformed JSON, a text over the matcher's limit, or a schema
    that cannot be applied all make the answer non-compliant."""
    kept = list(schemas)
    if not kept:
        return None

    def check(text: str) -> bool:
        stripped = text.strip()
        if len(stripped) > MAX_COMPLETION_CHARS:
            return False
        try:
            value = json.loads(stripped)
        except (ValueError, RecursionError):
            return False
        for schema in kept:
            try:
                if not schema_errors(schema, value):
                    return True
            except Exception:  # a schema stored before a check existed never crashes a verdict
                continue
        return False

    return check


@dataclass(frozen=True)
class FormatCompliance:
    """One version's sampled answers: how many were checked, how many complied."""

    version: str | None
    checked: int
    compliant: int

    @property
    def rate(self) -> float | None:
        return self.compliant / self.checked if self.checked else None

    def as_dict(self) -> dict[str, Any]:
        return {"version": self.version, "checked": self.checked, "compliant": self.compliant, "rate": self.rate}


def measure(version: str | None, samples: Iterable[str], check: FormatCheck | None) -> FormatCompliance | None:
    """Compliance of one version's samples; None when no schema is declared."""
    if check is None:
        return None
    texts = list(samples)
    return FormatCompliance(version, len(texts), sum(1 for text in texts if check(text)))
