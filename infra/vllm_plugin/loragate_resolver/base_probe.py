"""A known-answer check that what the replica labels "base" is the base: a fixed prompt asked
of the base when nothing else runs, and again while adapters' requests do.

A fallback promises the base model's answer (``x-loragate-fallback``). On vLLM's CPU path a
base row batched beside an adapter's got that adapter's delta (``cpu_lora_ops``, which now
prevents it); this check does not trust the engine to keep that promise. The probe is one
greedy completion of ``PROBE_PROMPT`` by the base (``PROBE_TOKENS`` tokens). Its reference
answer is taken while the split has no request in flight and none starts before it returns:
a batch with no adapter's row, which vLLM's own ``no_lora`` path computes right. From then
on the probe is asked again, at most every ``LORAGATE_BASE_PROBE_S`` (default 10; 0 turns it
off) and only **while adapters' requests are in flight** -- when the base's rows share
batches with theirs, where a leak shows -- and compared with the reference. Asking it the
moment a leak happens is not needed: the leak is the engine's, and every mixed batch has it.

A mismatch is counted (``loragate_base_probes_total{outcome}`` in ``/metrics``, ``base_probe``
in the figures) and raised as a ``fallback_mismatch`` alert for each adapter in flight then
(at most ``ALERTED_AT_MOST``), which the fleet's traffic watch records and announces. Requests
that pass the split untouched (the fleet's own, with its key) are not counted in flight: on an
engine that leaks, one of those beside the reference can make the reference wrong, and later
probes then disagree with it (an alert) or leak the same delta and agree; where
``base_rows_guarded`` is true no row leaks and the reference is the base's. One probe in
flight at a time, bounded by ``DEADLINE_S``; a probe that fails or times out is counted
``given_up``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from loragate_resolver import metrics

EVERY_VARIABLE = "LORAGATE_BASE_PROBE_S"
DEFAULT_EVERY_S = 10.0
PROBE_PATH = "/v1/completions"
PROBE_PROMPT = "The base model's own words, whatever adapters are loaded:"
PROBE_TOKENS = 16
DEADLINE_S = 60.0
ALERTED_AT_MOST = 8
_KEPT = 1 << 20

log = logging.getLogger("loragate_resolver.base_probe")


def _every(default: float = DEFAULT_EVERY_S) -> float:
    raw = os.environ.get(EVERY_VARIABLE)
    if raw is None:
        return default
    try:
        return max(0.0, float(raw))
    except ValueError:
        log.warning("loragate: %s=%r is not a number of seconds; %s used", EVERY_VARIABLE, raw, default)
        return default


class BaseProbe:
    """The probe (module docstring); ``tick`` once a second from the split's loop."""

    def __init__(self, every_s: float | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.every_s = _every() if every_s is None else every_s
        self.clock = clock
        self.reference: str | None = None
        self.checked = self.mismatched = self.given_up = 0
        self._last: float | None = None
        self._running: asyncio.Task | None = None

    def figures(self) -> dict[str, Any]:
        return {
            "every_s": self.every_s,
            "reference_taken": self.reference is not None,
            "checked": self.checked,
            "mismatched": self.mismatched,
            "given_up": self.given_up,
        }

    def due(self, busy: bool) -> bool:
        """A reference is taken quiet; a check is made busy, at most every ``every_s``."""
        if self.every_s <= 0 or (self._running is not None and not self._running.done()):
            return False
        if self.reference is None:
            return not busy
        return busy and (self._last is None or self.clock() - self._last >= self.every_s)

    def tick(self, split: Any) -> bool:
        """Start a probe when one is due on a production replica (the only one that answers
        from the base) whose server's app is known; True when started."""
        if split.role != "production" or split.server_app is None or split.base_name is None:
            return False
        in_flight = [name for name, count in split.in_flight.items() if count > 0]
        if not self.due(bool(in_flight)):
            return False
        self._last = self.clock()
        self._running = asyncio.ensure_future(self._probe(split, in_flight[:ALERTED_AT_MOST], split.requests_started))
        return True

    async def _probe(self, split: Any, in_flight: list[str], started: int) -> None:
        body = json.dumps(
            {"model": split.base_name, "prompt": PROBE_PROMPT, "max_tokens": PROBE_TOKENS, "temperature": 0}
        ).encode()
        try:
            text = await asyncio.wait_for(ask(split.app, split.server_app, body), DEADLINE_S)
        except Exception as e:  # a busy or restarting engine: no evidence either way
            text = None
            log.info("loragate: the base probe gave up: %s", type(e).__name__)
        if text is None:
            self.given_up += 1
            return
        if self.reference is None:
            if split.requests_started == started and not any(split.in_flight.values()):
                self.reference = text  # nothing ran beside it: the base's own answer
            return
        self.checked += 1
        if text == self.reference:
            metrics.base_probe("match")
            return
        self.mismatched += 1
        metrics.base_probe("mismatch")
        reason = f"the base answered its probe {text[:80]!r}, alone it answered {self.reference[:80]!r}"
        log.error("loragate: the base's answer changed while adapters ran (%s)", reason)
        for adapter in in_flight:
            split.stats.alert("fallback_mismatch", adapter, "base", None, reason)


async def ask(app: Any, server_app: Any, body: bytes) -> str | None:
    """The first choice's text ``app`` (the stack under the split) answers ``body`` with on
    ``PROBE_PATH``, on a request of its own; None when not a 200 with text."""
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": PROBE_PATH,
        "raw_path": PROBE_PATH.encode(),
        "root_path": "",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        "client": ("127.0.0.1", 0),
        "server": ("127.0.0.1", 0),
        "app": server_app,
    }
    sent = False
    never = asyncio.Event()
    status, kept = 500, bytearray()

    async def receive() -> dict:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await never.wait()  # no disconnect: the probe runs to its end or its deadline
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body" and len(kept) < _KEPT:
            kept.extend(message.get("body", b""))

    await app(scope, receive, send)
    if status != 200:
        return None
    try:
        text = json.loads(bytes(kept))["choices"][0]["text"]
    except (ValueError, TypeError, IndexError, KeyError):
        return None
    return text if isinstance(text, str) else None
