"""Injected faults for the replicas of tests, benchmarks and the demo, read from
``LORAGATE_REPLICA_FAULTS``: the live split with a fault injector, which no shipped package holds.

The file is JSON ``{"<version id>": {"error": true} | {"delay_ms": N}}``: a client request the
split sends to that version gets a synthetic 500 (an error, so it falls back) or waits first.
An optional ``"breaker": {"errors": n, "slow": n, "cooldown_s": s}`` overrides the breaker's
limits (the session's replicas are shared: a test shortens the cooldown here, not by a
restart). Re-read when the file's mtime changes; missing or unreadable means no faults.

Only a replica started with a faults file loads this (``VllmReplica(faults_file=...)``,
``loragate/local/replica_split.py``): its ``PYTHONPATH`` is this folder, and its middleware is
``loragate_faults.FaultInjectingSplit`` in place of the plugin's ``TrafficSplit``, which injects
nothing (its ``faults`` is ``NoFaults``). The plugin installed on every replica
(``infra/vllm_plugin``) neither holds nor imports this module.
"""

from __future__ import annotations

import json
import os
from typing import Any

from loragate_resolver.traffic import NoFaults, TrafficSplit

FAULTS_VARIABLE = "LORAGATE_REPLICA_FAULTS"


class Faults(NoFaults):
    """The faults the file at ``path`` names, re-read when it changes."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self._faults: dict[str, Any] = {}

    def current(self) -> dict[str, Any]:
        if not self.path:
            return {}
        try:
            st = os.stat(self.path)
        except OSError:
            self._stamp, self._faults = None, {}
            return {}
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp != self._stamp:
            try:
                with open(self.path, encoding="utf-8") as f:
                    loaded = json.load(f)
            except (OSError, ValueError):
                loaded = {}
            self._faults = loaded if isinstance(loaded, dict) else {}
            self._stamp = stamp
        return self._faults

    def of(self, version: str) -> dict[str, Any]:
        found = self.current().get(version)
        return found if isinstance(found, dict) else {}

    def breaker(self) -> dict[str, Any]:
        found = self.current().get("breaker")
        return found if isinstance(found, dict) else {}


class FaultInjectingSplit(TrafficSplit):
    """The plugin's live split, with the faults ``LORAGATE_REPLICA_FAULTS`` names injected."""

    def __init__(self, app: Any) -> None:
        super().__init__(app)
        self.faults = Faults(os.environ.get(FAULTS_VARIABLE))
