"""Clients of the live split as users are (``bench/traffic.py``): one request at a time as a
given end user, and looping clients that keep requests in flight on a replica as ever new
users -- each answer recorded with the version that gave it (``x-loragate-version``), so a
move of traffic is seen where users see it.

Requests are plain HTTP (httpx), not the fleet's ``ReplicaClient``: no retries, no admin key
unless a peer asks for it, and nothing between the clock and the wire.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx

ADMIN_HEADER = "X-Loragate-Admin-Key"
# a request that takes longer than this is a failure, not a wait
REQUEST_TIMEOUT = httpx.Timeout(connect=5.0, read=60.0, write=10.0, pool=10.0)


@dataclass(frozen=True)
class Answer:
    started: float
    ended: float
    ok: bool
    status: int
    # x-loragate-version (a version id, ``base``), None when the replica sent none
    version: str | None
    fallback: str | None = None
    # which replica a balancer sent it to (``x-bench-upstream``), None when asked directly
    upstream: str | None = None
    # the completion's text (what the bytes that answered said)
    text: str | None = None

    @property
    def seconds(self) -> float:
        return self.ended - self.started


def ask(
    http: httpx.Client,
    url: str,
    model: str,
    prompt: str,
    max_tokens: int,
    *,
    user: str | None = None,
    admin_key: str | None = None,
) -> Answer:
    """One greedy completion as ``user`` (or as the fleet, with ``admin_key``)."""
    body: dict[str, Any] = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
    if user is not None:
        body["user"] = user
    headers = {ADMIN_HEADER: admin_key} if admin_key else {}
    started = time.perf_counter()
    try:
        response = http.post(f"{url}/v1/completions", json=body, headers=headers)
    except httpx.HTTPError:
        return Answer(started, time.perf_counter(), False, 0, None)
    ended = time.perf_counter()
    try:
        text = str(response.json()["choices"][0]["text"]).strip() if response.status_code == 200 else None
    except (ValueError, KeyError, IndexError, TypeError):
        text = None
    return Answer(
        started,
        ended,
        response.status_code == 200,
        response.status_code,
        response.headers.get("x-loragate-version"),
        response.headers.get("x-loragate-fallback"),
        response.headers.get("x-bench-upstream"),
        text,
    )


def new_client() -> httpx.Client:
    return httpx.Client(timeout=REQUEST_TIMEOUT)


@dataclass
class UserLoop:
    """``threads`` requests in flight on ``url`` for ``model``, each as a user never seen
    before (so a split's share shows in the answers), or as the fleet with ``admin_key``
    (naming ``keyed_canary`` for ``keyed_canary_share`` of them); runs until ``deadline_s``
    at the latest."""

    url: str
    model: str
    prompt: str
    max_tokens: int
    threads: int = 2
    admin_key: str | None = None
    deadline_s: float = 900.0
    # with ``admin_key``: the model a keyed request names instead of ``model`` this often --
    # the fleet choosing versions in the proportions the split would (a peer for its cost)
    keyed_canary: str | None = None
    keyed_canary_share: float = 0.0
    answers: list[Answer] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    @contextmanager
    def running(self) -> Iterator[UserLoop]:
        self._stop.clear()
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
        until = time.perf_counter() + self.deadline_s
        coin = random.Random()
        with new_client() as http:
            while not self._stop.is_set() and time.perf_counter() < until:
                user = None if self.admin_key else f"loop-{uuid.uuid4().hex}"
                model = self.model
                if self.admin_key and self.keyed_canary and coin.random() < self.keyed_canary_share:
                    model = self.keyed_canary
                answer = ask(http, self.url, model, self.prompt, self.max_tokens, user=user, admin_key=self.admin_key)
                self.answers.append(answer)
                if not answer.ok:
                    time.sleep(0.01)  # a refusing replica is not hammered in a tight loop

    def started_after(self, moment: float) -> list[Answer]:
        return [a for a in self.answers if a.started > moment]


def wait_for_answers(loops: list[UserLoop], after: float, count: int, deadline_s: float) -> bool:
    """Until every loop has ``count`` answers begun after ``after``; False at the deadline."""
    until = time.perf_counter() + deadline_s
    while time.perf_counter() < until:
        if all(len(loop.started_after(after)) >= count for loop in loops):
            return True
        time.sleep(0.05)
    return False


def last_answer_of(
    answers: list[Answer], version: str, since: float, returned: float, texts: dict[str, str] | None = None
) -> dict[str, Any]:
    """How long after ``since`` (a move's start) ``version`` still answered -- 0 when none of
    its answers ended after it -- and how many of its answers began after the move had
    returned (``returned``): requests sent after a rollback that still got the old version.
    By the version header; with ``texts`` (version -> what it answers the prompt) also by
    what the answer says, and how many answers' header named another version than their
    text."""

    def figures(of: list[Answer], suffix: str) -> dict[str, Any]:
        ended = [a.ended for a in of if a.ended > since]
        return {
            f"to_last_answer{suffix}_s": round(max(ended) - since, 3) if ended else 0.0,
            f"answers_after_start{suffix}": len(ended),
            f"answers_begun_after_return{suffix}": sum(a.started > returned for a in of),
        }

    ok = [a for a in answers if a.ok]
    out = figures([a for a in ok if a.version == version], "")
    if texts:
        by_text = {text: v for v, text in texts.items()}
        out |= figures([a for a in ok if a.text == texts[version]], "_by_text")
        out["header_not_text"] = sum(
            a.text in by_text and a.version in texts and by_text[a.text or ""] != a.version for a in ok
        )
    return out
