"""32 concurrent promote/rollback calls on one adapter, from separate processes, against
Postgres and the three real vLLM replicas: no lost update, and the audit log tells one
linear story that matches the final pointers and what the replicas serve.

The calls are a fixed mix of every move (production and canary promotions of three
versions, production rollbacks, canary withdrawals); which of them the lifecycle allows depends on the order
the adapter's lock hands out, so many are refused -- with exit 2 and one error line,
never exit 1. A canary promotion opens its window as the canary gate does and a withdrawal
closes it (no live split here: a share of 0); at the end at most one window is active, the
final canary's. Each call carries a reason of its own, so every audit event names the call
that wrote it. Replaying the pointer moves from the pointers before the race must chain
(each move starts from the value the previous one left) and end on the stored pointers,
stages and revision; every call that reported a change has exactly its event, and the
fleet events of each move follow it before the next one.

The figures of the run (docs/operations/fleet.md#faults-and-races) are printed as JSON and written to
``tests/artifacts/race.json``.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from loragate.registry.records.adapters import AuditEvent
from loragate.registry.rules.fleet import version_path
from loragate.registry.service import Registry
from loragate.registry.settings import Settings
from loragate.registry.storage.resolver_index import index_entry, read_index
from loragate.tasks.fleet import promote_and_switch
from tests.support.fleet import point_replicas, served
from tests.support.pointer_story import POINTER_MOVES, Story, replay
from tests.support.registries import IN_PROCESS, mark_validated, sign

CALLS = 32
CALL_TIMEOUT_S = 600
ARTIFACTS = Path(__file__).parent / "artifacts"


# -- the story the audit log must tell (tests/support/pointer_story.py), a check that can fail


def test_the_replay_catches_a_lost_update():
    """Two moves from the same pointer value (the second planned on a stale read) do not
    replay; the same two moves chained do."""

    def event(i: int, action: str, stage: str, frm: str | None, to: str | None, changes) -> AuditEvent:
        return AuditEvent(
            i,
            None,
            "t",
            action,
            "a/b/c",
            to if action == "promote" else frm,
            stage,
            frm,
            to,
            None,
            {"stage_changes": changes},
        )

    start = {"canary": "v2", "production": "v1", "previous": None}
    stages = {"v1": "production", "v2": "canary", "v3": "staging"}
    to_v2 = event(
        1, "promote", "production", "v1", "v2", [["v1", "production", "retired"], ["v2", "canary", "production"]]
    )
    back = event(
        2, "rollback", "production", "v2", "v1", [["v2", "production", "rolled_back"], ["v1", "retired", "production"]]
    )
    assert replay(Story(**start, stages=dict(stages)), [to_v2, back]).pointers() == {
        "canary": None,
        "production": "v1",
        "previous": None,
    }
    v3_canary = event(2, "promote", "canary", "v2", "v3", [["v2", "canary", "retired"], ["v3", "staging", "canary"]])
    with pytest.raises(AssertionError, match="event 2 .* the canary was None"):
        replay(Story(**start, stages=dict(stages)), [to_v2, v3_canary])


# -- the race ----------------------------------------------------------------------------


@dataclass
class Call:
    index: int
    kind: str
    argv: list[str]
    role: str
    returncode: int | None = None
    stdout: str = ""
    stderr: str = ""
    seconds: float = 0.0

    @property
    def reason(self) -> str:
        return f"race call {self.index:02d}"

    @property
    def payload(self) -> dict[str, Any]:
        return json.loads(self.stdout)

    @property
    def outcome(self) -> str:
        """moved, no_op, or the error code of a refusal."""
        if self.returncode != 0:
            return self.payload["error"]["code"]
        return "moved" if self.payload["changed"] else "no_op"


def the_mix(name: str, v1: str, v2: str, v3: str) -> list[Call]:
    """Promotions of the three versions to either stage, production rollbacks and canary
    withdrawals, in a fixed rotation."""
    kinds = [
        ("promote v2 --to production", ["promote", v2, "--to", "production"], "activation"),
        ("promote v3 --to canary", ["promote", v3, "--to", "canary"], "signing"),
        ("rollback --stage production", ["rollback", name, "--stage", "production"], "activation"),
        ("promote v3 --to production", ["promote", v3, "--to", "production"], "activation"),
        ("promote v2 --to canary", ["promote", v2, "--to", "canary"], "signing"),
        ("promote v1 --to canary", ["promote", v1, "--to", "canary"], "signing"),
        ("rollback --stage canary", ["rollback", name, "--stage", "canary"], "signing"),
    ]
    return [Call(i, *kinds[i % len(kinds)]) for i in range(CALLS)]


def run_call(call: Call, env: dict[str, str]) -> Call:
    command = str(Path(sys.executable).parent / "loragate")
    started = time.monotonic()
    proc = subprocess.Popen(
        [command, *call.argv, "--reason", call.reason, "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        call.stdout, call.stderr = proc.communicate(timeout=CALL_TIMEOUT_S)
        call.returncode = proc.returncode
    except subprocess.TimeoutExpired:
        proc.kill()
        call.stdout, call.stderr = proc.communicate()
        call.returncode = None  # hung: the assertion below names it
    call.seconds = time.monotonic() - started
    return call


def quantile(values: list[float], q: int) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


@pytest.mark.slow
def test_32_concurrent_promotes_and_rollbacks_tell_one_story(
    tmp_path, pg_template, seeded_bundles, tiny_base, replicas, replica_adapters
):
    settings = Settings(
        home=tmp_path / "home", database_url=pg_template(), artifacts=str(tmp_path / "artifacts"), actor="race-setup"
    )
    registry = Registry.open(settings, check_schema=False, principal=IN_PROCESS)
    try:
        registry.init()
        registry.add_base(str(tiny_base), "tiny-llama")
        point_replicas(replicas.values(), settings.database_url)
        for replica in replicas.values():
            registry.add_replica(replica.url, "tiny-llama", replica.role, str(replica_adapters))
        name = f"race{uuid.uuid4().hex[:8]}/tiny-llama/support"
        v1, v2, v3 = (registry.register_adapter(b, name).version.version_id for b in seeded_bundles[:3])
        for v in (v1, v2, v3):
            mark_validated(registry, v)
            sign(registry, v)  # a canary window opens only for a version signed over its validation
        promote_and_switch(registry, v1, "canary")
        promote_and_switch(registry, v1, "production")
        promote_and_switch(registry, v2, "canary")

        before = registry.get_adapter(name)
        assert (before.canary, before.production, before.previous) == (v2, v1, None)
        story = Story(v2, v1, None, {v.version_id: v.stage.value for v in registry.list_versions(name)})
        last_before = registry.history(name)[-1].id
        adapter_dir = str(replica_adapters)
        path = {v: version_path(adapter_dir, name, v) for v in (v1, v2, v3)}
        served_before = {r.url: _served(r, name) for r in replicas.values()}
        assert served_before == {r.url: path[v2] if r.role == "canary" else path[v1] for r in replicas.values()}

        tokens = {role: registry.create_token(role, f"racer-{role}")[1] for role in ("activation", "signing")}
        base_env = {k: v for k, v in os.environ.items() if not k.startswith("LORAGATE_")}
        base_env |= {
            "LORAGATE_DATABASE_URL": settings.database_url,
            "LORAGATE_ARTIFACTS": settings.artifacts,
            "LORAGATE_HOME": str(settings.home),
            # a canary promotion opens its window, dark: the race is about pointers and windows
            "LORAGATE_CANARY_SHARE": "0",
            # each call switches replicas: the fleet's admin key, by its file's path
            "LORAGATE_REPLICA_ADMIN_KEY_FILE": os.environ["LORAGATE_REPLICA_ADMIN_KEY_FILE"],
        }
        calls = the_mix(name, v1, v2, v3)
        # one call alone first, a no-op: what a call costs without 31 others beside it
        solo = run_call(
            Call(-1, "solo", ["promote", v2, "--to", "canary"], "signing"),
            {**base_env, "LORAGATE_TOKEN": tokens["signing"]},
        )
        assert solo.returncode == 0 and not solo.payload["changed"], solo.stderr
        load_before = os.getloadavg()[0]

        started, started_at = time.monotonic(), datetime.now(UTC)
        with concurrent.futures.ThreadPoolExecutor(max_workers=CALLS) as pool:
            done = list(pool.map(lambda c: run_call(c, {**base_env, "LORAGATE_TOKEN": tokens[c.role]}), calls))
        wall_s = time.monotonic() - started
        ARTIFACTS.mkdir(exist_ok=True)
        # every call as it ended, before anything is asserted: the evidence when something is
        (ARTIFACTS / "race-calls.json").write_text(
            json.dumps(
                [
                    {"index": c.index, "kind": c.kind, "returncode": c.returncode, "seconds": round(c.seconds, 2)}
                    | {"stdout": c.stdout, "stderr": c.stderr}
                    for c in done
                ],
                indent=1,
            )
        )

        # every call ended, succeeded or was refused: no crash, no escaped ConcurrentUpdate, no hang
        broken = [
            (c.index, c.argv[:2], c.returncode, c.stderr.strip()[-600:]) for c in done if c.returncode not in (0, 2)
        ]
        assert broken == [], broken
        for c in done:
            if c.returncode == 2:
                lines = c.stderr.splitlines()
                assert len(lines) == 1 and lines[0].startswith("error: "), (c.index, c.stderr)
        moved = [c for c in done if c.returncode == 0 and c.payload["changed"]]
        no_ops = [c for c in done if c.returncode == 0 and not c.payload["changed"]]
        refused = Counter(c.payload["error"]["code"] for c in done if c.returncode == 2)

        after = registry.get_adapter(name)
        events = [e for e in registry.history(name) if e.id > last_before]
        moves = [e for e in events if e.action in POINTER_MOVES]
        others = Counter(e.action for e in events if e.action not in POINTER_MOVES)
        assert set(others) <= {"deploy", "canary_window"}, others
        active = registry.canary_windows()
        assert [w.version_id for w in active] in ([], [after.canary]), (active, after.canary)

        # a. the pointer moves chain from the pointers before the race to the stored ones
        replay(story, moves)
        assert story.pointers() == {"canary": after.canary, "production": after.production, "previous": after.previous}
        assert story.stages == {v.version_id: v.stage.value for v in registry.list_versions(name)}
        assert after.revision - before.revision == len(moves), "each committed move bumps the revision once"
        times = [e.at for e in moves]
        assert times == sorted(times), "audit time order is commit order"

        # b. each call that reported a change wrote exactly its move, and no other call wrote one
        assert len(moved) == len(moves)
        by_reason: dict[str | None, list[AuditEvent]] = {}
        for e in events:
            if e.action in (*POINTER_MOVES, "deploy"):  # a window's own events are the windows' check
                by_reason.setdefault(e.reason, []).append(e)
        assert set(by_reason) <= {c.reason for c in moved}, "a no-op or refused call left an audit event"
        position = {e.id: i for i, e in enumerate(moves)}
        for c in moved:
            written = by_reason[c.reason]
            move, fleet = written[0], written[1:]
            p = c.payload
            assert (move.action, move.stage, move.from_value, move.to_value) == (
                p["action"],
                p["stage"],
                p["from"],
                p["to"],
            ), c.index
            assert move.details["stage_changes"] == p["stage_changes"], c.index
            assert all(e.action == "deploy" for e in fleet), (c.index, [e.action for e in written])
            assert [(e.details["replica"], e.from_value, e.to_value) for e in fleet] == [
                (r["replica"], r["from"], r["to"]) for r in p["replicas"]
            ], c.index
            # the fleet events of a move come before the next move: the log is one line
            following = moves[position[move.id] + 1].id if position[move.id] + 1 < len(moves) else float("inf")
            assert all(e.id < following for e in fleet), (
                f"call {c.index}: its fleet events {[e.id for e in fleet]} come after the next move {following}"
            )

        # c. the replicas serve what the final pointers say, as the fleet events replayed say
        fleet_story = {r.url: v2 if r.role == "canary" else v1 for r in replicas.values()}
        for e in events:
            if e.action == "deploy":
                url = e.details["replica"]
                assert e.from_value == fleet_story[url], (e.id, url, e.from_value, fleet_story[url])
                fleet_story[url] = e.to_value
        index = read_index(adapter_dir)["roles"]
        for r in replicas.values():
            wanted = after.production if r.role == "production" else (after.canary or after.production)
            serves = _served(r, name)
            assert serves == path[wanted], (r.url, r.role, serves, wanted)
            assert fleet_story[r.url] == wanted, (r.url, r.role, fleet_story[r.url], wanted)
            assert index[r.role][name] == index_entry(wanted, path[wanted], registry.bundle_digests(wanted))

        seconds = sorted(c.seconds for c in done)
        figures = {
            "test": "tests/test_race.py",
            "database": "postgresql",
            "replicas": dict(Counter(r.role for r in replicas.values())),
            "calls": len(done),
            "by_kind": {
                kind: dict(Counter(c.outcome for c in done if c.kind == kind))
                for kind in dict.fromkeys(c.kind for c in done)
            },
            "wall_s": round(wall_s, 2),
            "succeeded": {"moved": len(moved), "no_op": len(no_ops)},
            "refused": dict(sorted(refused.items())),
            "failed": 0,
            "solo_no_op_call_s": round(solo.seconds, 2),
            "call_s": {
                "p50": round(quantile(seconds, 50), 2),
                "p95": round(quantile(seconds, 95), 2),
                "max": round(seconds[-1], 2),
            },
            "audit": {"pointer_moves": len(moves), "fleet_events": others.get("deploy", 0)},
            # when the moves were written, seconds after the launch: the lock serialises them
            "moves_at_s": [round((e.at - started_at).total_seconds(), 1) for e in moves],
            "final": story.pointers() | {"versions": {"v1": v1, "v2": v2, "v3": v3}},
            "cpus": os.cpu_count(),
            "load_average_1m_at_launch": round(load_before, 1),
        }
        (ARTIFACTS / "race.json").write_text(json.dumps(figures, indent=2) + "\n")
        print("\nrace figures:", json.dumps(figures, indent=2))
        assert len(moved) + len(no_ops) + sum(refused.values()) == CALLS
    finally:
        registry.close()


def _served(replica, name: str) -> str | None:
    return served(replica).get(name)
