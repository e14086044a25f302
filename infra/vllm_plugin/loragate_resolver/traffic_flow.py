"""One client request through the split (``traffic.TrafficSplit``): the versions asked in
turn, what the client gets, and what is counted.

A production replica asks the chosen version first -- the canary for the user's share, else
production -- then production, then the base model. A version whose breaker is open is
skipped (``breaker_open``); one that answers 404, 400 or 5xx (its start message is held
back, never sent) failed and the next one is asked with the same buffered body. The last
one's answer goes to the client whatever it is. A failure counts against its version only
where a later version answered the request -- the canary's only where production did
(``charged``): a 400 every version gave is the client's own, a fault every version shares
is the replica's. Only the
answer's start message is held; its body streams through as it comes. A good
non-streaming answer's body (already kept for its usage) also gives its text, sampled for
the format check (``live_stats``); streamed answers are not sampled. A version the residency
guard refuses (``engine_cache``) is skipped, as one whose breaker is open, and charged to none.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Container
from dataclasses import dataclass
from typing import Any

from loragate_resolver import engine_cache, metrics, qualified, request_ids, routing
from loragate_resolver.admin_guard import _error, _replay
from loragate_resolver.residency import REFUSED

VERSION_HEADER = b"x-loragate-version"
REQUEST_ID_HEADER = b"x-loragate-request-id"
FALLBACK_HEADER = b"x-loragate-fallback"
BASE = "base"
_KEPT_BODY = 1 << 20  # of a non-streaming answer, for its usage
OFF_LOOP_BYTES = 64 * 1024  # a body this large is written off the event loop
# a whole (non-streaming) answer gives a per-token time only with this many tokens
MIN_TOKENS_PER_RATE = 16

log = logging.getLogger("loragate_resolver.traffic")


@dataclass(frozen=True)
class Step:
    version: str | None  # None: the base model
    window: int | None
    kind: str  # canary, production or base: the fallback reason's first word

    @property
    def label(self) -> str:
        return self.version or BASE


class Attempt:
    """What one version answered, as far as the split needs it."""

    def __init__(self) -> None:
        self.status = 500
        self.started = self.swallowed = False
        # the engine's clock: from this version being asked (the body complete, the versions
        # before it done) to its last byte -- no way of sending a request moves it
        self.began = time.perf_counter()
        self.first_chunk_at: float | None = None
        self.last_chunk_at: float | None = None
        self.events = 0
        self.residency: str | None = None  # warm or cold: its adapter's, as the guard saw it
        self.kept: list[bytes] = []
        self.kept_size = 0
        self._parsed: dict | None = None
        self._was_parsed = False

    def parsed(self) -> dict | None:
        """The kept non-streaming answer as JSON, parsed once (None: cut or not an object)."""
        if not self._was_parsed:
            self._was_parsed = True
            try:
                found = json.loads(b"".join(self.kept))
            except (ValueError, RecursionError):
                found = None
            self._parsed = found if isinstance(found, dict) else None
        return self._parsed

    def tokens(self, streaming: bool) -> int | None:
        """Completion tokens: a stream's ``data:`` events, else the answer's usage."""
        if streaming:
            return self.events or None
        usage = (self.parsed() or {}).get("usage")
        tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
        return tokens if isinstance(tokens, int) and tokens > 0 else None

    def ms_per_token(self, streaming: bool, finished: float) -> float | None:
        """Decode time per token: a stream's time from its first event to its last over the
        tokens after the first; a whole answer's time over its tokens only when it has
        ``MIN_TOKENS_PER_RATE`` of them, so prefill (a long prompt, a one-token answer) is a
        small part of it. None where neither holds."""
        if streaming:
            if self.first_chunk_at is None or self.last_chunk_at is None or self.events < 2:
                return None
            return (self.last_chunk_at - self.first_chunk_at) * 1000 / (self.events - 1)
        tokens = self.tokens(streaming)
        if tokens is None or tokens < MIN_TOKENS_PER_RATE:
            return None
        return (finished - self.began) * 1000 / tokens

    def text(self) -> str | None:
        """The first choice's text: ``choices[0].text`` (completions) or
        ``choices[0].message.content`` (chat); None where the answer has neither."""
        choices = (self.parsed() or {}).get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            return None
        choice = choices[0]
        if isinstance(choice.get("text"), str):
            return choice["text"]
        message = choice.get("message")
        content = message.get("content") if isinstance(message, dict) else None
        return content if isinstance(content, str) else None


def failed(status: int) -> bool:
    """An answer the next version is asked instead of (not loaded, not loadable, broken)."""
    return status in (400, 404) or status >= 500


def chain(split: Any, route: routing.Route, user: str, index_version: str | None) -> list[Step]:
    if split.role != "production":  # a canary replica labels and counts; it never splits
        return [Step(index_version or route.production, route.window, "canary")]
    decision = routing.decide(route, user)
    steps = []
    if decision.canary:
        steps.append(Step(decision.version, decision.window, "canary"))
    steps.append(Step(route.production, route.window, "production"))
    if split.base_name:
        steps.append(Step(None, None, BASE))
    return steps


async def answer(
    split: Any,
    scope: dict,
    receive: Any,
    send: Any,
    body: dict,
    raw: bytes,
    route: routing.Route,
    user: str,
    index_version: str | None,
) -> None:
    adapter, streaming = route.adapter, body.get("stream") is True
    steps = chain(split, route, user, index_version)
    splitting = split.role == "production"
    limits = split.current_limits()
    reason: str | None = None
    failures: list[tuple[Step, int]] = []
    final: tuple[Step, Attempt] | None = None
    written: dict[str, bytes] = {body.get("model"): raw}  # each rewritten body written once
    feedback_key = split.feedback_key()
    for i, step in enumerate(steps):
        last = i == len(steps) - 1
        fault: dict = {}
        began: float | None = None
        if splitting and step.version is not None:
            if not last and not split.breaker(adapter, step.version).allow(limits):
                split.stats.skipped(adapter, step.version, step.window)
                reason = reason or "breaker_open"
                continue
            fault = split.faults.of(step.version)
            began = time.perf_counter()  # an injected delay is the engine's: it is timed
            delay = fault.get("delay_ms")
            if isinstance(delay, int | float) and delay > 0:
                await asyncio.sleep(delay / 1000)
        headers = _headers(feedback_key, adapter, step, reason)
        if fault.get("error") is True:
            if not last:
                failures.append((step, 500))
                reason = reason or f"{step.kind}_failed:500"
                continue
            attempt = Attempt()
            await _send_error(send, headers)
            final = (step, attempt)
            break
        served = split.base_name if step.version is None else adapter
        if splitting and step.version is not None:
            loaded = loaded_names(scope)
            served = routing.served_name(
                adapter, step.version, index_version, loaded, routing.path_version(loaded_path(scope, adapter))
            )
        admission = None
        if step.version is not None:
            admission = engine_cache.admit(split, adapter, served, last)
            if admission.kind == REFUSED:  # the engine's cache cannot take it now
                reason = reason or f"{step.kind}_residency:{admission.reason}"
                continue
        if served not in written:
            written[served] = await _rewritten(body, served, len(raw))
        attempt = await _forward(split.app, scope, receive, send, written[served], headers, last, streaming, began)
        if admission is not None:
            engine_cache.attempted(split, adapter, served, admission, attempt)
        if attempt.swallowed:
            failures.append((step, attempt.status))
            reason = reason or f"{step.kind}_failed:{attempt.status}"
            continue
        final = (step, attempt)
        break
    assert final is not None  # the last step always answers
    _account(split, route, final, failures, reason, streaming, user)


def _serving_table(scope: dict) -> dict | None:
    """vLLM's name -> LoRA request table of the app serving ``scope``, or None."""
    try:
        found = scope["app"].state.openai_serving_models.lora_requests
    except (KeyError, AttributeError):
        return None
    return found if isinstance(found, dict) else None


def loaded_path(scope: dict, name: str) -> str | None:
    """The path vLLM has ``name`` loaded from (its LoRA request's ``lora_path``), or None."""
    table = _serving_table(scope)
    path = getattr(dict.get(table, name) if table is not None else None, "lora_path", None)
    return path if isinstance(path, str) else None


def loaded_names(scope: dict) -> Container[str]:
    """The adapter names vLLM has loaded now (its serving models' table), or none known: every
    one, qualified names included -- the split chooses among them (the table's keys, which
    its guard against clients does not filter: ``qualified``)."""
    table = _serving_table(scope)
    return table.keys() if table is not None else ()


async def _rewritten(body: dict, served: str, size: int) -> bytes:
    """The body naming ``served`` as its model (written off the event loop when large)."""

    def write() -> bytes:
        return json.dumps({**body, "model": served}).encode()

    return await asyncio.to_thread(write) if size > OFF_LOOP_BYTES else write()


def _headers(feedback_key: str | None, adapter: str, step: Step, reason: str | None) -> list[tuple[bytes, bytes]]:
    headers = [(VERSION_HEADER, step.label.encode())]
    if feedback_key:  # without the fleet's feedback key no id is given: nothing could check it
        request_id = request_ids.sign(feedback_key, adapter, step.label, step.window)
        headers.append((REQUEST_ID_HEADER, request_id.encode()))
    if reason:
        headers.append((FALLBACK_HEADER, reason.encode()))
    return headers


async def _send_error(send: Any, headers: list[tuple[bytes, bytes]]) -> None:
    status, payload = _error(500, "InternalServerError", "injected fault")
    start = [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode()), *headers]
    await send({"type": "http.response.start", "status": status, "headers": start})
    await send({"type": "http.response.body", "body": payload})


def _with_length(scope: dict, length: int) -> dict:
    headers = [(k, v) for k, v in scope.get("headers", []) if k.lower() != b"content-length"]
    return {**scope, "headers": [*headers, (b"content-length", str(length).encode())]}


async def _forward(
    app: Any,
    scope: dict,
    receive: Any,
    send: Any,
    body: bytes,
    headers: list[tuple[bytes, bytes]],
    last: bool,
    streaming: bool,
    began: float | None = None,
) -> Attempt:
    """Ask the app once; its failure is held back (``swallowed``) unless it is the last."""
    attempt = Attempt()
    if began is not None:
        attempt.began = began

    async def relay(message: dict) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            attempt.status = message["status"]
            if not last and failed(attempt.status):
                attempt.swallowed = True
                return
            attempt.started = True
            await send({**message, "headers": [*message.get("headers", []), *headers]})
            return
        if attempt.swallowed:
            return
        if kind == "http.response.body":
            chunk = message.get("body", b"")
            if chunk:
                attempt.last_chunk_at = time.perf_counter()
                if attempt.first_chunk_at is None:
                    attempt.first_chunk_at = attempt.last_chunk_at
                if streaming:
                    attempt.events += chunk.count(b"data:") - chunk.count(b"data: [DONE]")
                elif attempt.kept_size < _KEPT_BODY:
                    attempt.kept.append(chunk)
                    attempt.kept_size += len(chunk)
        await send(message)

    try:
        with qualified.chosen():  # the split chose this name, qualified or not
            await app(_with_length(scope, len(body)), _replay(body, receive), relay)
    except Exception:
        if attempt.started or last:
            raise
        log.exception("loragate: a version's request raised; the next one is asked")
        attempt.status, attempt.swallowed = 500, True
    return attempt


def _account(
    split: Any,
    route: routing.Route,
    final: tuple[Step, Attempt],
    failures: list[tuple[Step, int]],
    reason: str | None,
    streaming: bool,
    user: str,
) -> None:
    adapter, (step, attempt) = route.adapter, final
    unit = routing.unit(route, user)
    finished = time.perf_counter()
    # the answering version's own time: a version asked before it and failed is not in it
    latency_ms = (finished - attempt.began) * 1000
    for failed_step, _status in failures:
        counted = charged(failed_step, step, attempt.status)
        split.stats.failed(adapter, failed_step.label, failed_step.window, error=counted, unit=unit)
        metrics.request(adapter, failed_step.label, "fallback", None, None)
        if failed_step.version is not None and counted:
            _breaker(split, adapter, failed_step, ok=False, slow=False)
    if reason:
        metrics.fallback(adapter, reason)
    # a first token is a stream's: a whole answer's first byte is its last
    ttft_ms = (attempt.first_chunk_at - attempt.began) * 1000 if streaming and attempt.first_chunk_at else None
    error = attempt.status >= 500
    good = attempt.status < 400
    per_token = split.stats.answered(
        adapter,
        step.label,
        step.window,
        error=error,
        latency_ms=latency_ms,
        ttft_ms=ttft_ms,
        ms_per_token=attempt.ms_per_token(streaming, finished) if good else None,
        text=attempt.text() if good and not streaming else None,
        unit=unit,
    )
    if split.role == "production" and step.version is not None:
        # slowness is judged against production: production itself trips on errors only (on
        # contended cores its own tail would otherwise send its users to the base for noise)
        judged = per_token is not None and step.version != route.production
        p99 = split.stats.production_p99(adapter, route.production) if judged else None
        slow = judged and p99 is not None and per_token is not None and per_token > 3 * p99
        _breaker(split, adapter, step, ok=not error, slow=slow)
    split.stats.finished(adapter, reason is not None, user, answered=good)
    if ttft_ms is not None and attempt.residency is not None:
        metrics.first_token_by_residency(adapter, attempt.residency, ttft_ms / 1000)
    metrics.request(
        adapter, step.label, "error" if error else "ok", latency_ms / 1000, ttft_ms / 1000 if ttft_ms else None
    )


def charged(failed_step: Step, final: Step, final_status: int) -> bool:
    """Whether a version's failure on a request counts against it: only where the request
    was answerable -- a later version answered it -- and, for the canary, only where
    production did. Where no version answered, the failure is the client's own request (a
    400 every version gave) or every version's (overload, an engine restart), and shows as
    the replica's fallback rate, not as a version's errors."""
    return final_status < 400 and (failed_step.kind != "canary" or final.kind == "production")


def _breaker(split: Any, adapter: str, step: Step, ok: bool, slow: bool) -> None:
    assert step.version is not None
    breaker = split.breaker(adapter, step.version)
    tripped = breaker.record(ok, slow, split.current_limits())
    if tripped is not None:
        split.stats.alert("breaker_open", adapter, step.version, step.window, tripped)
        log.warning("loragate: breaker open for %s = %s on this replica: %s", adapter, step.version, tripped)
    metrics.breaker(adapter, step.version, breaker.opened_at is not None)
