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
from registry.storage.resolver_index import build_index, write_index
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
    replica lost, correct a wrong path, unload what no pointer wants; each action audited."""
    adapters = registry.adapter_pointers()
    replicas = registry.list_replicas()
    for adapter_dir, index in build_index(replicas, adapters).items():
        write_index(adapter_dir, index)
    states = fleet_status(registry)
    entries = []
    for state in states:
        for action in state.actions:
            try:
                with replica_client(registry, state.replica.url) as client:
                    if action.kind == ActionKind.UNLOAD:
                        unload_replica(client, action.name)
                    else:
                        assert action.placement is not None
                        materialize_for(registry, state.replica, action.placement)
                        if action.kind == ActionKind.LOAD:
                            client.load(action.name, action.placement.path)
                        else:
                            switch_replica(client, action.name, action.placement.path)
            except (ReplicaError, LoragateError) as e:
                state.error = e.one_line()
                progress(f"{state.replica.url}: {action.describe()} failed: {e.one_line()}")
                continue
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
    registry.record_fleet_actions("reconcile", entries)
    return states
