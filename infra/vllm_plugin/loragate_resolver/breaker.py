"""A circuit breaker per (adapter, version) on one replica.

``errors`` failed answers in a row, or ``slow`` answers in a row slower per token than the
bound the caller gives (3x production's p99), open the breaker: the version gets no traffic
here for ``cooldown_s`` (its requests go where a failure would have sent them). After the
cooldown one request is let through (half-open): its success closes the breaker, its
failure opens it again. Each opening is a trip, reported to the caller (an alert).

Pure and clocked by the caller, so the rules are tested without waiting.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

CLOSED, OPEN, HALF_OPEN = "closed", "open", "half_open"


@dataclass(frozen=True)
class Limits:
    errors: int = 5
    slow: int = 3
    cooldown_s: float = 30.0


class Breaker:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.errors_in_row = 0
        self.slow_in_row = 0
        self.opened_at: float | None = None
        self.probing = False  # the half-open request is in flight
        self.probe_at = 0.0
        self.trips = 0

    def state(self, limits: Limits) -> str:
        if self.opened_at is None:
            return CLOSED
        if self.clock() - self.opened_at < limits.cooldown_s:
            return OPEN
        return HALF_OPEN

    def allow(self, limits: Limits) -> bool:
        """Whether a request may go to the version now (claims the half-open probe)."""
        state = self.state(limits)
        if state == CLOSED:
            return True
        # a probe never accounted for (its client went away) does not hold the breaker forever
        if state == HALF_OPEN and (not self.probing or self.clock() - self.probe_at > limits.cooldown_s):
            self.probing, self.probe_at = True, self.clock()
            return True
        return False

    def record(self, ok: bool, slow: bool, limits: Limits) -> str | None:
        """Account one answer; the reason when this answer opened the breaker."""
        was_probe, self.probing = self.probing, False
        if ok and not slow:
            self.errors_in_row = self.slow_in_row = 0
            if was_probe:
                self.opened_at = None
            return None
        if not ok:
            self.errors_in_row += 1
            self.slow_in_row = 0
        else:
            self.slow_in_row += 1
            self.errors_in_row = 0
        reason = None
        if was_probe:
            reason = "half-open request failed" if not ok else "half-open request slow"
        elif self.opened_at is None and self.errors_in_row >= limits.errors:
            reason = f"{self.errors_in_row} errors in a row"
        elif self.opened_at is None and self.slow_in_row >= limits.slow:
            reason = f"{self.slow_in_row} answers in a row slower than 3x production's p99 per token"
        if reason is not None:
            self.opened_at = self.clock()
            self.errors_in_row = self.slow_in_row = 0
            self.trips += 1
        return reason
