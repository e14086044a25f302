"""The pinning rules (``registry/rules/pinning.py``), table-driven: the hot set is the busiest
adapters (ties by name, none without a request) filling what a person's pins leave of the
limit, a person's pins are never dropped; the limit is ``LORAGATE_HOT_PINS`` and never more
than the smallest production replica's slots leave beside its warm copies and one free slot."""

from __future__ import annotations

import pytest

from loragate.registry.rules.pinning import choose_hot, hot_limit

# case, requests by adapter, operator pins, limit, hot set chosen (in order)
CHOICES = [
    ("the busiest first", {"a": 5, "b": 50, "c": 20}, set(), 2, ["b", "c"]),
    ("ties broken by name", {"d": 7, "b": 7, "c": 7, "a": 1}, set(), 2, ["b", "c"]),
    ("no request, no pin", {"a": 0, "b": 3, "c": 0}, set(), 3, ["b"]),
    ("nothing requested", {"a": 0}, set(), 5, []),
    ("no traffic at all", {}, set(), 5, []),
    ("limit above the busy ones", {"a": 2, "b": 1}, set(), 10, ["a", "b"]),
    ("operator pins take their room", {"a": 9, "b": 8, "c": 7, "d": 6}, {"x"}, 3, ["a", "b"]),
    ("an operator pin is never also hot", {"a": 9, "b": 8, "c": 7}, {"a"}, 3, ["b", "c"]),
    ("operator pins filling the limit leave no hot pin", {"a": 9}, {"x", "y"}, 2, []),
    ("operator pins beyond the limit: no hot pin, none dropped", {"a": 9}, {"x", "y", "z"}, 2, []),
    ("a limit of 0 pins nothing hot", {"a": 9, "b": 1}, set(), 0, []),
    ("a negative count is no request", {"a": -3, "b": 1}, set(), 2, ["b"]),
]


@pytest.mark.parametrize(("case", "requests", "operator", "limit", "expected"), CHOICES, ids=[c[0] for c in CHOICES])
def test_the_hot_set_is_the_busiest_adapters_within_what_the_operators_pins_leave(
    case, requests, operator, limit, expected
):
    chosen = choose_hot(requests, operator, limit)
    assert chosen == expected
    assert not set(chosen) & operator
    assert len(chosen) + len(operator) <= max(limit, len(operator))


# case, LORAGATE_HOT_PINS, production replicas' max_loras, warm copies, limit
LIMITS = [
    ("the setting when the slots allow it", 10, [32, 32], 2, 10),
    ("the smallest replica's slots less warm less one", 10, [8, 16], 2, 5),
    ("no warm copy: all but one slot", 10, [4], 0, 3),
    ("one slot: none pinned", 10, [1], 0, 0),
    ("warm copies fill the slots: none pinned", 10, [4], 3, 0),
    ("warm copies beyond the slots: none, never negative", 10, [4], 9, 0),
    ("0 disables hot pinning", 0, [32], 0, 0),
    ("no production replica: no room", 10, [], 0, 0),
]


@pytest.mark.parametrize(("case", "setting", "slots", "warm", "expected"), LIMITS, ids=[c[0] for c in LIMITS])
def test_the_limit_is_the_setting_and_never_more_than_the_smallest_replica_leaves(case, setting, slots, warm, expected):
    limit = hot_limit(setting, slots, warm)
    assert limit == expected
    if slots and limit:
        # pinned + warm leaves at least one slot free on every production replica
        assert limit + warm <= min(slots) - 1
