"""Warm copies in the pure plan (``loragate/registry/rules/fleet.py``): which versions of an
adapter a replica may keep as ``name@version`` (``warm_versions``), and what reconcile does
with every qualified name a replica serves (``plan_reconcile``). Tables, no replica: what the
replicas themselves do is ``test_warm_copies.py``'s.
"""

from __future__ import annotations

import pytest

from loragate.registry.rules.fleet import (
    ActionKind,
    AdapterPointers,
    Replica,
    ReplicaRole,
    desired_placements,
    plan_reconcile,
    split_qualified,
    warm_versions,
)

X = "a/tiny-llama/x"
LOAD, SWITCH, UNLOAD, STRAY = ActionKind.LOAD, ActionKind.SWITCH, ActionKind.UNLOAD, ActionKind.UNLOAD_STRAY


def replica(role=ReplicaRole.PRODUCTION) -> Replica:
    return Replica("http://r1:8000", "tiny-llama", "c" * 40, role, "/adapters", 16, 4, "tiny-llama")


def at(version: str, name: str = X) -> str:
    return f"/adapters/{name}/{version}"


@pytest.mark.parametrize(
    ("canary", "production", "previous", "window", "allowed"),
    [
        ("v2", "v1", "v0", "v2", {"v2", "v0"}),  # the canary with an active window, and the previous
        ("v2", "v1", "v0", None, {"v0"}),  # a canary whose window is closed (or never opened) is not warm
        ("v2", "v1", None, "v9", set()),  # a window of another version: superseded, its version not the canary
        (None, "v1", "v0", "v1", {"v0"}),  # a promoted canary's window still open: production is never warm
        (None, "v1", None, None, set()),  # after a rollback: nothing
        ("v2", None, None, "v2", {"v2"}),  # a first canary
    ],
)
def test_at_most_the_canary_of_an_active_window_and_the_previous_production_may_be_warm(
    canary, production, previous, window, allowed
):
    assert warm_versions(AdapterPointers(X, "tiny-llama", canary, production, previous), window) == allowed


def test_a_qualified_name_splits_at_its_last_qualifier_and_a_plain_name_does_not():
    assert split_qualified(f"{X}@20260101_000000_abcdef012345") == (X, "20260101_000000_abcdef012345")
    assert split_qualified(X) is None
    assert split_qualified(f"{X}@") is None and split_qualified("@v1") is None


# production v1, previous v0, canary v2 with its window active
POINTERS = AdapterPointers(X, "tiny-llama", canary="v2", production="v1", previous="v0")
ALLOWED = {X: warm_versions(POINTERS, "v2")}


@pytest.mark.parametrize(
    ("served", "allowed", "expected"),
    [
        # the previous and the canary of an active window, warm from their own copies, stay
        ({X: at("v1"), f"{X}@v0": at("v0"), f"{X}@v2": at("v2")}, ALLOWED, []),
        # a warm copy that is missing is no drift: it is warmed when a split or a rollback needs it
        ({X: at("v1")}, ALLOWED, []),
        # a version rolled back or replaced two promotions ago: a stray
        ({X: at("v1"), f"{X}@v9": at("v9")}, ALLOWED, [(STRAY, f"{X}@v9")]),
        # the canary once its window closed: a stray
        ({X: at("v1"), f"{X}@v2": at("v2")}, {X: warm_versions(POINTERS, None)}, [(STRAY, f"{X}@v2")]),
        # an allowed version served from another path than its own copy: a stray
        ({X: at("v1"), f"{X}@v0": "/elsewhere/v0"}, ALLOWED, [(STRAY, f"{X}@v0")]),
        # production beside the plain name: a stray
        ({X: at("v1"), f"{X}@v1": at("v1")}, ALLOWED, [(STRAY, f"{X}@v1")]),
        # production served only warm (a move that moved traffic): the plain name first, then the copy
        ({f"{X}@v1": at("v1")}, ALLOWED, [(LOAD, X), (STRAY, f"{X}@v1")]),
        # the plain name on old bytes and production warm: switched first, then the copy
        ({X: at("v0"), f"{X}@v1": at("v1")}, ALLOWED, [(SWITCH, X), (STRAY, f"{X}@v1")]),
        # no allowance known for the adapter (not in the registry): every qualified copy is a stray
        ({X: at("v1"), f"{X}@v0": at("v0")}, {}, [(STRAY, f"{X}@v0")]),
        # a qualified copy of an adapter no pointer wants, of this base: a stray, beside its plain unload
        (
            {X: at("v1"), "d/tiny-llama/gone": at("v3", "d/tiny-llama/gone"), "d/tiny-llama/gone@v3": at("v3")},
            ALLOWED,
            [(UNLOAD, "d/tiny-llama/gone"), (STRAY, "d/tiny-llama/gone@v3")],
        ),
        # another base's qualified name, or one that is not a loragate name: never touched
        ({X: at("v1"), "e/other-base/q@v1": "/x", "someone-elses-lora@v1": "/y"}, ALLOWED, []),
    ],
)
def test_reconcile_unloads_every_qualified_copy_but_the_allowed_ones_after_production_is_plain(
    served, allowed, expected
):
    r = replica()
    desired = desired_placements(r, [POINTERS])
    assert [(a.kind, a.name) for a in plan_reconcile(r, desired, served, warm=allowed)] == expected


def test_a_stray_says_which_copy_goes_from_where_and_why_and_is_about_its_adapter():
    r = replica()
    desired = desired_placements(r, [POINTERS])
    served = {X: at("v1"), f"{X}@v9": at("v9"), f"{X}@v1": at("v1"), f"{X}@v0": "/elsewhere/v0"}
    described = {a.name: (a.adapter, a.describe()) for a in plan_reconcile(r, desired, served, warm=ALLOWED)}
    assert described == {
        f"{X}@v0": (X, f"http://r1:8000: unload stray warm copy {X}@v0 (served from /elsewhere/v0: not v0's own copy)"),
        f"{X}@v1": (
            X,
            f"http://r1:8000: unload stray warm copy {X}@v1 (served from {at('v1')}: "
            "v1 is served under the plain name)",
        ),
        f"{X}@v9": (
            X,
            f"http://r1:8000: unload stray warm copy {X}@v9 (served from {at('v9')}: "
            "v9 is neither the canary of an active window nor the previous production)",
        ),
    }
