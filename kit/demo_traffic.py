"""The demo's live traffic: a dozen users looping on the production replica, and what their
answers say -- which version gave each (``x-loragate-version``), the canary's share of them,
the same version for a user every time, and the answers production or the base gave when
the chosen version could not (``x-loragate-fallback``)."""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx

from kit.demo_console import banner, loragate, say, wait_for
from kit.demo_registry import SUPPORT, registry, stage_of, version_of

USERS = [f"tenant-user-{i}" for i in range(12)]


@dataclass(frozen=True)
class Answer:
    at: float
    user: str
    version: str
    fallback: str | None


@dataclass
class LoopingUsers:
    """Users asking ``name`` on ``url`` in turn, one request at a time, until stopped."""

    url: str
    name: str
    prompt: str
    pause_s: float = 0.2
    answers: list[Answer] = field(default_factory=list)
    failures: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> LoopingUsers:
        self._thread = threading.Thread(target=self._loop, daemon=True, name="demo-users")
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=70)

    def _loop(self) -> None:
        with httpx.Client(base_url=self.url, timeout=60) as client:
            turn = 0
            while not self._stop.is_set():
                user = USERS[turn % len(USERS)]
                turn += 1
                body = {"model": self.name, "prompt": self.prompt, "max_tokens": 4, "temperature": 0, "user": user}
                try:
                    answered = client.post("/v1/completions", json=body)
                except httpx.HTTPError:
                    self.failures += 1
                    continue
                if answered.status_code != 200 or "x-loragate-version" not in answered.headers:
                    self.failures += 1
                else:
                    version = answered.headers["x-loragate-version"]
                    fallback = answered.headers.get("x-loragate-fallback")
                    self.answers.append(Answer(time.monotonic(), user, version, fallback))
                self._stop.wait(self.pause_s)

    def since(self, seconds: float) -> list[Answer]:
        cutoff = time.monotonic() - seconds
        return [a for a in list(self.answers) if a.at >= cutoff]

    def report(self, seconds: float, label: str) -> None:
        """One line: the versions that answered the users over the last ``seconds``, how
        many users saw more than one, the fallbacks and why."""
        recent = self.since(seconds)
        if not recent:
            say(f"users ({label}): no answers in the last {seconds:.0f}s")
            return
        versions = Counter(a.version for a in recent)
        per_user: dict[str, set[str]] = {}
        for a in recent:
            if a.fallback is None:
                per_user.setdefault(a.user, set()).add(a.version)
        switched = sum(len(v) > 1 for v in per_user.values())
        reasons = Counter(a.fallback for a in recent if a.fallback)
        shares = ", ".join(f"{v} {n / len(recent):.0%}" for v, n in versions.most_common())
        say(
            f"users ({label}), last {seconds:.0f}s: {len(recent)} answers -- {shares}; "
            f"{switched} of {len(per_user)} users saw two versions; "
            + (f"fallbacks {dict(reasons)}" if reasons else "no fallback")
            + (f"; {self.failures} errors seen by users" if self.failures else "")
        )

    def show_one(self) -> None:
        """The headers of one answer, as a client sees them."""
        body = {"model": self.name, "prompt": self.prompt, "max_tokens": 4, "temperature": 0, "user": USERS[0]}
        answered = httpx.post(f"{self.url}/v1/completions", json=body, timeout=60)
        for header in ("x-loragate-version", "x-loragate-fallback", "x-loragate-request-id"):
            value = answered.headers.get(header)
            if value is not None:
                say(f"  {header}: {value[:60] + '...' if len(value) > 60 else value}")


def live_errors_rolled_back(pipeline, bundle, golden, users: LoopingUsers, faults_file) -> None:
    """A version that passes shadow validation and every probe, but whose answers to users
    fail on the production replica (an injected fault): its users get production's answers
    with the fallback header, its breaker trips, and the canary watch rolls it back on the
    live figures alone."""
    import json

    banner("support v3: a canary that fails its users' requests -- rolled back on live traffic alone")
    loragate("training-completed", str(bundle), "--name", SUPPORT, "--golden-set", str(golden), env=pipeline.env)
    version = wait_for("registered by the register flow", lambda: version_of(SUPPORT, bundle))
    faults_file.write_text(json.dumps({version: {"error": True}}))
    say(f"injected on the production replica: every user request {version} answers fails (a 500)")
    wait_for(
        "shadow validation passed (the fault touches only users' requests)", lambda: stage_of(version)[1] == "passed"
    )
    wait_for("canary: warm on the production replica, then half the users", lambda: stage_of(version)[0] == "canary")
    wait_for(
        "rolled back by the canary watch", lambda: stage_of(version)[0] == "rolled_back", timeout_s=300, every_s=2.0
    )
    users.report(40, f"{version}'s canary")
    with registry() as reg:
        window = reg.latest_canary_window(version)
        observed = reg.canary_observations(window.id)[-1]
    say(f"why: {'; '.join(observed.reasons)}")
    say(
        f"its probes: {observed.canary.errors}/{observed.canary.requests} errors, golden drift {observed.drift:.2f} "
        "-- only live traffic showed it"
    )
    faults_file.write_text("{}")
    loragate("status")
