"""Is the live split what was configured (``bench/traffic.py``, section ``split``)?

For each configured share, users never seen before ask for the adapter once each through a
round-robin balancer over the production replicas (``bench/traffic_balancer.py``), one token
each: the version is in the answer's header, the tokens do not matter. The share of users
the canary answered is set against the configured one two ways: the observed share's Wilson
interval at 99 % must hold the configured share, and the count must lie in the central 99 %
of Binomial(users, share) -- what a fair coin of that weight gives. Then a part of the users
ask again, several times, through the same balancer: every answer of a user must come from
the same version (sticky), whichever replica gave it; reported for one replica alone and
across replicas.
"""

from __future__ import annotations

import concurrent.futures
import math
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

from bench.traffic_balancer import Balancer
from bench.traffic_clients import Answer, ask, new_client

Z_99 = 2.5758293035489004  # the standard normal's 99.5th percentile: a two-sided 99 % interval


def wilson(successes: int, n: int, z: float = Z_99) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion (no n: the whole of [0, 1])."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def binomial_central(n: int, p: float, mass: float = 0.99) -> tuple[int, int]:
    """The smallest and largest counts of the central ``mass`` of Binomial(n, p): at most
    (1 - mass) / 2 of the distribution lies below the first, and as much above the last."""
    if p <= 0 or p >= 1:
        return (0, 0) if p <= 0 else (n, n)
    tail = (1 - mass) / 2
    log_p, log_q = math.log(p), math.log1p(-p)
    pmf = [
        math.exp(math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1) + k * log_p + (n - k) * log_q)
        for k in range(n + 1)
    ]
    low, below = 0, 0.0
    while below + pmf[low] <= tail:
        below += pmf[low]
        low += 1
    high, above = n, 0.0
    while above + pmf[high] <= tail:
        above += pmf[high]
        high -= 1
    return low, high


def stickiness(by_user: dict[str, list[Answer]]) -> dict[str, Any]:
    """Of the users answered more than once: how many always got the same version, on one
    replica alone (answers from one upstream) and across replicas (users answered by more
    than one upstream: what only a decision every replica makes alike keeps sticky).
    ``decisions``: the same with the answers that say they are a fallback set aside (a
    tripped breaker or a failed load sends a user elsewhere on purpose, and says so): the
    split's own choice."""

    def sticky(groups: list[list[Answer]]) -> dict[str, Any]:
        groups = [g for g in groups if len(g) > 1]
        kept = sum(len({a.version for a in g}) == 1 for g in groups)
        return {
            "users": len(groups),
            "sticky": kept,
            "sticky_pct": round(100 * kept / len(groups), 3) if groups else None,
        }

    answered = {user: [a for a in answers if a.ok] for user, answers in by_user.items()}
    one_replica = [
        [a for a in answers if a.upstream == up]
        for answers in answered.values()
        for up in {a.upstream for a in answers}
    ]
    across = [answers for answers in answered.values() if len({a.upstream for a in answers}) > 1]
    decided = [[a for a in answers if a.fallback is None] for answers in answered.values()]
    return {
        "overall": sticky(list(answered.values())),
        "decisions": sticky(decided),
        "users_with_a_fallback": sum(any(a.fallback for a in answers) for answers in answered.values()),
        "one_replica": sticky(one_replica),
        "across_replicas": sticky(across),
        "answers_per_user": max((len(a) for a in answered.values()), default=0),
    }


def observed_share(first: list[Answer], canary: str, production: str, share: float) -> dict[str, Any]:
    answered = [a for a in first if a.ok]
    n, k = len(answered), sum(a.version == canary for a in answered)
    low, high = wilson(k, n)
    count_low, count_high = binomial_central(n, share)
    return {
        "configured": share,
        "users": n,
        "canary_answers": k,
        "production_answers": sum(a.version == production for a in answered),
        "other_answers": sum(a.version not in (canary, production) for a in answered),
        "failed": len(first) - n,
        "fallbacks": sum(a.fallback is not None for a in answered),
        "observed": round(k / n, 5) if n else None,
        "wilson_99": [round(low, 5), round(high, 5)],
        "configured_in_wilson_99": low <= share <= high,
        "binomial_99_counts": [count_low, count_high],
        "count_in_binomial_99": count_low <= k <= count_high,
    }


def _label(version: str | None, canary: str, production: str) -> str:
    return {canary: "canary", production: "production"}.get(version or "", str(version))


def ask_users(
    url: str, model: str, prompt: str, users: list[str], workers: int, deadline_s: float
) -> dict[str, list[Answer]]:
    """Each user asks once, ``workers`` at a time, one token each; users left when the
    deadline passes are not asked."""
    until = time.perf_counter() + deadline_s
    found: dict[str, list[Answer]] = {u: [] for u in users}
    local = threading.local()
    clients = []
    lock = threading.Lock()

    def one(user: str) -> None:
        if time.perf_counter() > until:
            return
        http = getattr(local, "http", None)
        if http is None:
            http = local.http = new_client()
            with lock:
                clients.append(http)
        found[user].append(ask(http, url, model, prompt, 1, user=user))

    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
            list(pool.map(one, users))
    finally:
        for http in clients:
            http.close()
    return found


def bench_split(
    balancer: Balancer,
    model: str,
    prompt: str,
    canary: str,
    production: str,
    set_share: Callable[[float], None],
    shares: list[float],
    users: int,
    sticky_users: int,
    repeats: int,
    workers: int,
    deadline_s: float,
    log: Callable[[str], None],
    breakers: Callable[[], Any] = lambda: None,
) -> dict[str, Any]:
    """Per share: the observed share of ``users`` fresh users, then ``sticky_users`` of them
    asking ``repeats`` times more; all through ``balancer``. ``breakers``: the replicas'
    breaker states after each share (what a fallback came from)."""
    result: dict[str, Any] = {}
    for share in shares:
        set_share(share)
        run = uuid.uuid4().hex[:8]
        names = [f"user-{run}-{i}" for i in range(users)]
        started = time.perf_counter()
        balancer.start_at(0)
        by_user = ask_users(balancer.url, model, prompt, names, workers, deadline_s)
        first = [answers[0] for answers in by_user.values() if answers]
        for repeat in range(1, repeats + 1):
            balancer.start_at(repeat)
            again = ask_users(balancer.url, model, prompt, names[:sticky_users], workers, deadline_s)
            for user, answers in again.items():
                by_user[user] += answers
        took = time.perf_counter() - started
        asked = sum(len(a) for a in by_user.values())
        every = [a for answers in by_user.values() for a in answers]
        result[f"{share:g}"] = {
            **observed_share(first, canary, production, share),
            "stickiness": stickiness(by_user),
            # every answer, repeats included: which version, by upstream, and why a fallback
            "answers": {
                f"{a_up} {a_version}": n
                for (a_up, a_version), n in sorted(
                    Counter((str(a.upstream), _label(a.version, canary, production)) for a in every).items()
                )
            },
            "fallback_reasons": dict(Counter(a.fallback for a in every if a.fallback)),
            "breakers": breakers(),
            "requests": asked,
            "requests_per_s": round(asked / took, 1),
        }
        row = result[f"{share:g}"]
        log(
            f"share {share:g}: observed {row['observed']} of {row['users']} users, wilson99 {row['wilson_99']}, "
            f"sticky {row['stickiness']['overall']['sticky_pct']} %, across replicas "
            f"{row['stickiness']['across_replicas']['sticky_pct']} %"
        )
    return result
