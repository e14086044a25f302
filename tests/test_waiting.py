"""How a waiting gate counts the answers behind it (``flows/waiting.py``): a suspended run
re-entering from the top replays only the wait that resumed it."""

from __future__ import annotations

import pytest

from loragate.flows.waiting import WaitingRun

KEYS = ["approval-7", "approval-7-1", "approval-7-2"]


@pytest.mark.parametrize(
    ("fired", "answered"),
    [
        (set(), 0),  # first entry: nothing answered, the first wait waits
        ({"approval-7"}, 1),  # resumed once: replay wait 0
        ({"approval-7", "approval-7-1"}, 2),  # one refusal behind it: replay wait 1 only
        ({"approval-7", "approval-7-1", "approval-7-2"}, 3),
        ({"approval-7-1"}, 0),  # a later key alone does not count: answers are in order
        ({"approval-70", "approval-7-10"}, 0),  # another window's keys are not this one's
        ({"approval-7", "other-key"}, 1),
    ],
)
def test_only_the_waits_answered_in_order_count(fired, answered):
    assert WaitingRun(suspends=True, fired=frozenset(fired)).answered(KEYS) == answered
