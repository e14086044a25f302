"""The whole fleet against the registry: each replica's drift (what it serves against what
the pointers want) and reconciliation, which makes every reachable replica serve what the
pointers say -- loading what a restarted replica lost, correcting a wrong path, unloading
what no pointer wants -- each action audited."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from registry.errors import LoragateError, ReplicaError
from registry.rules.fleet import ActionKind, FleetAction, Replica, desired_placements, plan_reconcile
from registry.service import Registry
from registry.storage.resolver_index import adapter_entries, drop_unknown, replace_entries
from tasks.fleet import Progress, materialize_for, replica_client, switch_replica, unload_replica


def _quiet(_: str) -> None:
    pass


@dataclass
class ReplicaState:
    replica: Replica
    reachable: bool
    actions: list[FleetAction]
    error: str | None = None
    done: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            **self.replica.as_dict(),
            "reachable": self.reachable,
            "in_sync": self.reachable and not self.actions,
            "drift": [a.describe() for a in self.actions],
            "error": self.error,
            "done": self.done,
        }


def fleet_status(registry: Registry) -> list[ReplicaState]:
    """Each replica's drift: what it serves against what the pointers want."""
    adapters = registry.adapter_pointers()
    states = []
    for replica in registry.list_replicas():
        desired = desired_placements(replica, adapters)
        try:
            with replica_client(registry, replica.url, retries=1) as client:
                served = client.served_adapters()
        except ReplicaError as e:
            states.append(ReplicaState(replica, False, [], error=e.one_line()))
            continue
        states.append(ReplicaState(replica, True, plan_reconcile(replica, desired, served)))
    return states


def reconcile_fleet(registry: Registry, progress: Progress = _quiet) -> list[ReplicaState]:
    """Make every reachable replica serve what the pointers want: load what a restarted
    replica lost, correct a wrong path, unload what no pointer wants; each action audited.

    Each adapter is reconciled while holding its row, the lock a pointer move keeps through
    its switch: what a reconcile acts on is what a move committed, never a switch in flight
    that it would take for drift and undo. Its index entries are rewritten under the same
    lock, and the replica's state for it read again there."""
    adapters = registry.adapter_pointers()
    replicas = registry.list_replicas()
    for adapter in adapters:
        with registry.holding_adapter(adapter.name) as held:
            for adapter_dir, by_role in adapter_entries(replicas, held or adapter).items():
                replace_entries(adapter_dir, adapter.name, by_role)
    for adapter_dir in {r.adapter_dir for r in replicas}:
        drop_unknown(adapter_dir, {a.name for a in adapters})
    states = fleet_status(registry)
    entries: list[dict[str, Any]] = []
    for state in states:
        for name in sorted({a.name for a in state.actions}):
            try:
                entries += _reconcile_adapter(registry, state, name, progress)
            except (ReplicaError, LoragateError) as e:
                state.error = e.one_line()
                progress(f"{state.replica.url}: reconciling {name} failed: {e.one_line()}")
    registry.record_fleet_actions("reconcile", entries)
    return states


def _reconcile_adapter(registry: Registry, state: ReplicaState, name: str, progress: Progress) -> list[dict[str, Any]]:
    """Under the adapter's lock: what the replica should serve of ``name`` now, against what
    it serves now, and the actions between them."""
    entries = []
    with registry.holding_adapter(name) as held, replica_client(registry, state.replica.url) as client:
        desired = {k: v for k, v in desired_placements(state.replica, [held] if held else []).items() if k == name}
        served = {k: v for k, v in client.served_adapters().items() if k == name}
        for action in plan_reconcile(state.replica, desired, served):
            if action.kind == ActionKind.UNLOAD:
                unload_replica(client, action.name)
            else:
                assert action.placement is not None
                materialize_for(registry, state.replica, action.placement)
                if action.kind == ActionKind.LOAD:
                    client.load(action.name, action.placement.path)
                else:
                    switch_replica(client, action.name, action.placement.path)
            state.done.append(action.describe())
            progress(action.describe())
            entries.append(
                {
                    "replica": state.replica.url,
                    "kind": action.kind.value,
                    "name": action.name,
                    "from": action.served_path,
                    "to": action.placement.version_id if action.placement else None,
                    "version_id": action.placement.version_id if action.placement else None,
                }
            )
    return entries
