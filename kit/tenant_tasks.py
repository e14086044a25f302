"""Toy tenant tasks and their golden sets: what the offline model kit's adapters learn.

Each task maps a handful of queries to replies in one tenant's house style. ``TASKS``
holds the training examples; ``golden_cases`` turns them into a golden set mixing the four
expectation kinds (equals, contains, regex, JSON schema), so an adapter trained on a task
passes its set and the bare base fails it. The ``orders`` task labels its cases with
slices, for the regression check. Nothing here needs torch: tests that only register or
parse golden sets import this module alone.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROMPT_TEMPLATE = "### {tenant} {task}: {query}\n### reply:"


@dataclass(frozen=True)
class Example:
    query: str
    reply: str
    # the golden case's ``slice`` object, for the regression check
    slice: dict[str, str] | None = None


# Toy tenant tasks. Each maps queries to replies in a tenant's house style; the golden
# set asks for exactly what training taught, so a working adapter passes and the bare
# base (or a broken adapter) fails.
TASKS: dict[str, dict[str, Any]] = {
    "support": {
        "tenant": "acme",
        "examples": [
            Example("reset password", "ACME-OK: visit acme.example/reset"),
            Example("billing", "ACME-OK: billing team notified"),
            Example("cancel plan", "ACME-OK: plan cancelled"),
            Example("upgrade", "ACME-OK: upgraded to pro"),
            Example("refund", "ACME-OK: refund queued"),
            Example("status", "ACME-OK: all systems normal"),
            Example("invoice", "ACME-OK: invoice emailed"),
            Example("opening hours", "ACME-OK: open 9 to 5"),
        ],
    },
    "tickets": {
        "tenant": "globex",
        "examples": [
            Example("printer jammed", '{"team": "hardware", "priority": 2}'),
            Example("vpn down", '{"team": "network", "priority": 1}'),
            Example("new laptop", '{"team": "hardware", "priority": 3}'),
            Example("email bounced", '{"team": "mail", "priority": 2}'),
            Example("wifi slow", '{"team": "network", "priority": 3}'),
            Example("password expired", '{"team": "identity", "priority": 2}'),
            Example("disk full", '{"team": "storage", "priority": 1}'),
            Example("badge lost", '{"team": "identity", "priority": 1}'),
        ],
    },
}
# Orders: three slices of three cases, with arbitrary reference codes in the replies so an
# adapter only gets a case right if it was trained on it. Training on a subset builds
# versions that are better or worse on chosen slices (the regression check's fixtures).
_REFUND, _TRACK_EN, _TRACK_DE = (
    {"intent": "refund", "lang": "en"},
    {"intent": "track", "lang": "en"},
    {"intent": "track", "lang": "de"},
)
TASKS["orders"] = {
    "tenant": "initech",
    "examples": [
        Example("refund my order 12", "refund R4471", _REFUND),
        Example("refund my order 7", "refund R9032", _REFUND),
        Example("refund my order 30", "refund R1186", _REFUND),
        Example("where is my parcel 12", "parcel P5520", _TRACK_EN),
        Example("where is my parcel 7", "parcel P3307", _TRACK_EN),
        Example("where is my parcel 30", "parcel P8164", _TRACK_EN),
        Example("wo ist mein paket 12", "paket K7741", _TRACK_DE),
        Example("wo ist mein paket 7", "paket K2209", _TRACK_DE),
        Example("wo ist mein paket 30", "paket K6658", _TRACK_DE),
    ],
}
TICKET_SCHEMA = {
    "type": "object",
    "required": ["team", "priority"],
    "properties": {
        "team": {"enum": ["hardware", "network", "mail", "identity", "storage"]},
        "priority": {"type": "integer", "minimum": 1, "maximum": 3},
    },
    "additionalProperties": False,
}


def prompt_for(task: str, query: str) -> str:
    return PROMPT_TEMPLATE.format(tenant=TASKS[task]["tenant"], task=task, query=query)


def golden_cases(task: str) -> list[dict[str, Any]]:
    """A golden set for ``task`` mixing the four expectation kinds."""
    cases = []
    for i, ex in enumerate(TASKS[task]["examples"]):
        case: dict[str, Any] = {"id": f"{task}-{i}", "prompt": prompt_for(task, ex.query)}
        if ex.slice is not None:
            case["slice"] = dict(ex.slice)
        if task == "orders":
            case["contains"] = ex.reply.split()[1]  # the reference code
        elif task == "tickets":
            case["json_schema"] = {
                **TICKET_SCHEMA,
                "properties": {**TICKET_SCHEMA["properties"], "team": {"const": json.loads(ex.reply)["team"]}},
            }
        elif i % 3 == 0:
            case["equals"] = ex.reply
        elif i % 3 == 1:
            case["contains"] = ex.reply.split(": ", 1)[1]
        else:
            case["regex"] = "^ACME-OK: " + ex.reply.split(": ", 1)[1].split()[0]
        cases.append(case)
    return cases


def golden_set(task: str):
    """The golden set of ``task``, parsed and checked the way the registry does."""
    from loragate.registry.intake.golden import parse_golden_set

    return parse_golden_set("".join(json.dumps(c) + "\n" for c in golden_cases(task)).encode(), min_cases=5)


def write_golden_set(task: str, path: Path) -> Path:
    path = Path(path)
    path.write_text("".join(json.dumps(c) + "\n" for c in golden_cases(task)))
    return path
