"""The whole fleet against the registry: each replica's drift (what it serves against what
the pointers want, and whether the bytes of each copy it serves still verify) and
reconciliation, which makes every reachable replica serve what the pointers say -- loading
what a restarted replica lost, correcting a wrong path, unloading what no pointer wants and
every stray warm copy ``name@version`` (a version that is neither the canary of an active
window nor the previous production: ``rules/fleet.py`` ``warm_versions``), repairing a
damaged copy (quarantined, materialized again, reloaded, its answers verified) -- each action
audited. A missing warm copy is no drift: it is warmed when a split or a rollback needs it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loragate.registry.errors import LoragateError, ReplicaError
from loragate.registry.progress import Progress, quiet
from loragate.registry.rules.fleet import (
    ActionKind,
    AdapterPointers,
    FleetAction,
    Placement,
    Replica,
    adapter_of,
    desired_placements,
    plan_reconcile,
    warm_versions,
)
from loragate.registry.service import Registry
from loragate.registry.storage.copies import VerifiedCache, cache_file, damaged_files, quarantine
from loragate.registry.storage.resolver_index import adapter_entries, drop_unknown, replace_entries
from loragate.tasks.copies import materialize_for
from loragate.tasks.replica_switch import load_replica, switch_replica, unload_replica, verify_replica
from loragate.tasks.replicas import replica_client


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


class CopyChecker:
    """Whether the copies replicas load still hash to their versions' digests; one stat
    cache per adapter directory, a version's digests read once per check."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self._caches: dict[str, VerifiedCache] = {}
        self._digests: dict[str, Mapping[str, str]] = {}
        # copies this reconcile quarantined and fetched again: every replica that served the
        # damaged bytes reloads, not only the first one found
        self.repaired: dict[str, tuple[str, ...]] = {}

    def damaged(self, replica: Replica, placements: Mapping[str, Placement]) -> dict[str, list[str]]:
        """Adapter name -> the damaged files of its copy, for the copies that are there."""
        if replica.adapter_dir not in self._caches:
            path = cache_file(self.registry.settings.home, replica.adapter_dir)
            self._caches[replica.adapter_dir] = VerifiedCache.load(path)
        cache = self._caches[replica.adapter_dir]
        found = {}
        for name, placement in placements.items():
            copy = Path(placement.path)
            if not copy.exists():
                continue  # materialized when it is loaded
            bad = damaged_files(copy, self.digests(placement.version_id), cache)
            if bad:
                found[name] = bad
        return found

    def digests(self, version_id: str) -> Mapping[str, str]:
        """The version's file digests, read from the registry once per check."""
        if version_id not in self._digests:
            self._digests[version_id] = self.registry.bundle_digests(version_id)
        return self._digests[version_id]

    @property
    def hashed(self) -> int:
        return sum(c.hashed for c in self._caches.values())

    def save(self) -> None:
        for cache in self._caches.values():
            cache.save()


def allowed_warm(registry: Registry, adapters: list[AdapterPointers]) -> dict[str, frozenset[str]]:
    """Adapter name -> the versions it may keep warm as ``name@version`` now."""
    windows = {w.adapter_name: w.version_id for w in registry.canary_windows()}
    return {a.name: warm_versions(a, windows.get(a.name)) for a in adapters}


def fleet_status(registry: Registry, checker: CopyChecker | None = None) -> list[ReplicaState]:
    """Each replica's drift: what it serves against what the pointers want (stray warm
    copies included), and the copies whose bytes no longer verify."""
    adapters = registry.adapter_pointers()
    warm = allowed_warm(registry, adapters)
    checker = checker or CopyChecker(registry)
    states = []
    try:
        for replica in registry.list_replicas():
            desired = desired_placements(replica, adapters)
            try:
                with replica_client(registry, replica.url, retries=1) as client:
                    served = client.served_adapters()
            except ReplicaError as e:
                states.append(ReplicaState(replica, False, [], error=e.one_line()))
                continue
            damaged = checker.damaged(replica, desired)
            states.append(ReplicaState(replica, True, plan_reconcile(replica, desired, served, damaged, warm)))
    finally:
        checker.save()
    return states


def reconcile_fleet(registry: Registry, progress: Progress = quiet) -> list[ReplicaState]:
    """Make every reachable replica serve what the pointers want: load what a restarted
    replica lost, correct a wrong path, unload what no pointer wants and every stray warm
    copy; each action audited.

    Each adapter is reconciled while holding its row, the lock a pointer move keeps through
    its switch: what a reconcile acts on is what a move committed, never a switch in flight
    that it would take for drift and undo. Its index entries are rewritten under the same
    lock, and the replica's state for it read again there."""
    adapters = registry.adapter_pointers()
    replicas = registry.list_replicas()
    checker = CopyChecker(registry)
    for adapter in adapters:
        with registry.holding_adapter(adapter.name) as held:
            for adapter_dir, by_role in adapter_entries(replicas, held or adapter, checker.digests).items():
                replace_entries(adapter_dir, adapter.name, by_role)
    for adapter_dir in {r.adapter_dir for r in replicas}:
        drop_unknown(adapter_dir, {a.name for a in adapters})
    states = fleet_status(registry, checker)
    entries: list[dict[str, Any]] = []
    try:
        for state in states:
            for name in sorted({a.adapter for a in state.actions}):
                try:
                    entries += _reconcile_adapter(registry, checker, state, name, progress)
                except (ReplicaError, LoragateError) as e:
                    state.error = e.one_line()
                    progress(f"{state.replica.url}: reconciling {name} failed: {e.one_line()}")
    finally:
        checker.save()
    registry.record_fleet_actions("reconcile", entries)
    return states


def _reconcile_adapter(
    registry: Registry, checker: CopyChecker, state: ReplicaState, name: str, progress: Progress
) -> list[dict[str, Any]]:
    """Under the adapter's lock: what the replica should serve of ``name`` now, against what
    it serves now and the state of its copy on disk, and the actions between them."""
    entries = []
    replica = state.replica
    with registry.holding_adapter(name) as held, replica_client(registry, replica.url) as client:
        desired = {k: v for k, v in desired_placements(replica, [held] if held else []).items() if k == name}
        served = {k: v for k, v in client.served_adapters().items() if adapter_of(k) == name}
        window = registry.active_canary_window(name) if held else None
        warm = {name: warm_versions(held, window.version_id if window else None)} if held else {}
        damaged = checker.damaged(replica, desired)
        for wanted in desired.values():
            if wanted.path in checker.repaired:
                damaged.setdefault(wanted.name, list(checker.repaired[wanted.path]))
        for action in plan_reconcile(replica, desired, served, damaged, warm):
            quarantined = None
            if action.kind in (ActionKind.UNLOAD, ActionKind.UNLOAD_STRAY):
                unload_replica(client, action.name)
            else:
                assert action.placement is not None
                path = action.placement.path
                if action.damaged and path not in checker.repaired:
                    # set aside for whoever investigates; the version is fetched afresh
                    quarantined = quarantine(Path(path), replica.adapter_dir)
                    checker.repaired[path] = action.damaged
                    progress(f"{replica.url}: {action.name}'s damaged copy moved to {quarantined}")
                materialize_for(registry, replica, action.placement)
                if action.kind == ActionKind.LOAD:
                    load_replica(client, action.name, action.placement.path)
                else:
                    switch_replica(client, action.name, action.placement.path)
                if action.kind == ActionKind.REPAIR:
                    verify_replica(
                        client,
                        replica,
                        action.placement,
                        registry.expected_outputs(action.placement.version_id),
                        registry.settings.deploy_agreement,
                    )
            state.done.append(action.describe())
            progress(action.describe())
            entries.append(
                {
                    "replica": state.replica.url,
                    "kind": action.kind.value,
                    "name": action.adapter,
                    **({"served_as": action.name} if action.name != action.adapter else {}),
                    "from": action.served_path,
                    "to": action.placement.version_id if action.placement else None,
                    "version_id": action.placement.version_id if action.placement else None,
                    **({"damaged": list(action.damaged)} if action.damaged else {}),
                    **({"quarantined": str(quarantined)} if quarantined else {}),
                }
            )
    return entries
