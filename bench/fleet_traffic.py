"""A client that keeps requests in flight on a replica for an adapter's logical name, and
what its requests saw: latency, failures, and any answer that is neither version's."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from bench.timing import summarize
from loragate.registry.errors import ReplicaError
from loragate.tasks.replicas import ReplicaClient


@dataclass
class Request:
    started: float
    ended: float
    ok: bool
    text: str


@dataclass
class LoopingClient:
    url: str
    name: str
    prompt: str
    max_tokens: int
    threads: int = 2
    cpus: list[int] | None = None  # the cores its threads run on; None: wherever the caller's do
    requests: list[Request] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    @contextmanager
    def running(self) -> Iterator[LoopingClient]:
        workers = [threading.Thread(target=self._loop, daemon=True) for _ in range(self.threads)]
        for w in workers:
            w.start()
        try:
            yield self
        finally:
            self._stop.set()
            for w in workers:
                w.join()

    def _loop(self) -> None:
        if self.cpus is not None:
            os.sched_setaffinity(0, self.cpus)  # 0: this thread only, on Linux
        with ReplicaClient(self.url, retries=0) as client:
            while not self._stop.is_set():
                started = time.perf_counter()
                try:
                    text = client.complete(self.name, self.prompt, self.max_tokens).text.strip()
                    ok = True
                except ReplicaError as e:
                    text, ok = e.code.value, False
                self.requests.append(Request(started, time.perf_counter(), ok, text))

    def between(self, windows: list[tuple[float, float]]) -> list[Request]:
        """The requests that overlapped one of the windows."""
        return [r for r in self.requests if any(r.started < end and r.ended > start for start, end in windows)]


def latency(requests: list[Request], answers: set[str], over_s: float | None = None) -> dict[str, Any]:
    """What the requests saw; with ``over_s``, the seconds the clients ran, also how many
    answers per second the replicas gave meanwhile (the load's throughput, so two ways of
    placing it can be compared)."""
    done = [r for r in requests if r.ok]
    return {
        **(summarize([int((r.ended - r.started) * 1e9) for r in done]) if done else {"n": 0}),
        "failed": sum(not r.ok for r in requests),
        "neither_version": sum(r.ok and r.text not in answers for r in requests),
        **({} if over_s is None else {"answered_per_s": round(len(done) / over_s, 1)}),
    }
