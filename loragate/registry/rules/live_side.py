"""One version's live figures over a canary window, as the production replicas count them
(the plugin's ``live_stats.py``, served at ``GET /loragate/traffic``), summed over replicas.

Per version entry: ``requests`` the version handled, ``errors`` among them (a failure that
fell back included), ``fallbacks`` the requests the base answered for it (its failures, and
requests its open breaker kept from it, which are not in ``requests``), latency samples of
its good answers, ``accepted``/``retried`` the tenant's feedback, ``trips`` of its breaker,
``samples`` the texts of its last good non-streaming answers (``rules/formats.py``), and
``units`` a sample of its users' requests and failures (``rules/units.py``).
``rules/live.py`` judges two of them against each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from loragate.registry.errors import ErrorCode, ReplicaError
from loragate.registry.rules.canary import percentile
from loragate.registry.rules.units import Units

_COUNTS = ("requests", "errors", "fallbacks", "accepted", "retried", "trips")
_SAMPLES = ("latency_ms", "ttft_ms", "ms_per_token")


@dataclass(frozen=True)
class LiveSide:
    """One side's live figures over a window, summed over replicas."""

    requests: int = 0
    errors: int = 0
    fallbacks: int = 0
    accepted: int = 0
    retried: int = 0
    latency_ms: tuple[float, ...] = ()
    ttft_ms: tuple[float, ...] = ()
    ms_per_token: tuple[float, ...] = ()
    trips: int = 0
    breaker_open: bool = False
    samples: tuple[str, ...] = ()  # answer texts, pooled over replicas
    units: Units = field(default_factory=Units)  # a sample of its users, merged over replicas

    @property
    def routed(self) -> int:
        """An upper bound of the requests sent its way: those it handled and those its
        breaker kept from it (a failure that fell back is in both: counted twice, on both
        sides alike)."""
        return self.requests + self.fallbacks

    @property
    def error_rate(self) -> float | None:
        return self.errors / self.requests if self.requests else None

    @property
    def acceptance_rate(self) -> float | None:
        rated = self.accepted + self.retried
        return self.accepted / rated if rated else None

    @property
    def p50_ms(self) -> float | None:
        return percentile(list(self.latency_ms), 50)

    @property
    def p95_ms(self) -> float | None:
        return percentile(list(self.latency_ms), 95)

    @property
    def p99_ms(self) -> float | None:
        return percentile(list(self.latency_ms), 99)

    @property
    def ms_per_token_p95(self) -> float | None:
        return percentile(list(self.ms_per_token), 95)

    @property
    def ttft_p95_ms(self) -> float | None:
        return percentile(list(self.ttft_ms), 95)

    def merge(self, other: LiveSide) -> LiveSide:
        """Both sides' figures as one (counts added, samples pooled, a breaker open if either's is)."""
        return LiveSide(
            requests=self.requests + other.requests,
            errors=self.errors + other.errors,
            fallbacks=self.fallbacks + other.fallbacks,
            accepted=self.accepted + other.accepted,
            retried=self.retried + other.retried,
            latency_ms=self.latency_ms + other.latency_ms,
            ttft_ms=self.ttft_ms + other.ttft_ms,
            ms_per_token=self.ms_per_token + other.ms_per_token,
            trips=self.trips + other.trips,
            breaker_open=self.breaker_open or other.breaker_open,
            samples=self.samples + other.samples,
            units=self.units.merge(other.units),
        )

    @classmethod
    def from_entry(cls, entry: dict[str, Any], where: str = "entry") -> LiveSide:
        """One version entry of a replica's traffic document.

        Raises:
            ReplicaError: REPLICA_REFUSED naming the field that is not a count or samples.
        """
        try:
            counts = {name: int(entry.get(name) or 0) for name in _COUNTS}
            samples = {name: tuple(float(v) for v in entry.get(name) or ()) for name in _SAMPLES}
            texts = tuple(entry.get("samples") or ())
        except (TypeError, ValueError) as e:
            raise ReplicaError(
                f"{where} of a traffic report holds a count or sample that is not a number",
                code=ErrorCode.REPLICA_REFUSED,
                field=where,
            ) from e
        if not all(isinstance(t, str) for t in texts):
            raise ReplicaError(
                f"{where} of a traffic report holds an answer sample that is not a text",
                code=ErrorCode.REPLICA_REFUSED,
                field=where,
            )
        if any(v < 0 for v in counts.values()):
            raise ReplicaError(f"{where} of a traffic report holds a negative count", field=where)
        return cls(
            requests=counts["requests"],
            errors=counts["errors"],
            fallbacks=counts["fallbacks"],
            accepted=counts["accepted"],
            retried=counts["retried"],
            latency_ms=samples["latency_ms"],
            ttft_ms=samples["ttft_ms"],
            ms_per_token=samples["ms_per_token"],
            trips=counts["trips"],
            breaker_open=entry.get("breaker") == "open",
            samples=texts,
            units=Units.from_entry(entry.get("units"), f"{where} units"),
        )

    def summary(self) -> dict[str, Any]:
        """The figures a person reads and the store keeps (sample counts, not the samples)."""
        return {
            "requests": self.requests,
            "errors": self.errors,
            "fallbacks": self.fallbacks,
            "accepted": self.accepted,
            "retried": self.retried,
            "error_rate": self.error_rate,
            "acceptance_rate": self.acceptance_rate,
            "p50_ms": self.p50_ms,
            "p95_ms": self.p95_ms,
            "p99_ms": self.p99_ms,
            "ms_per_token_p95": self.ms_per_token_p95,
            "ttft_p95_ms": self.ttft_p95_ms,
            "samples": len(self.latency_ms),
            "answers_sampled": len(self.samples),
            "trips": self.trips,
            "breaker_open": self.breaker_open,
            "units": self.units.summary(),
        }
