"""What the split and its metrics cost a replica (``bench/traffic.py``, section ``cost``).

The peer is the same replica, the same adapter with both versions warm, asked the same
prompt by the same number of clients, in the same run, the engine serving the same mix of
the two versions: only who chooses the version differs. ``on``: each request as a user never
seen before, so the replica's ``TrafficSplit`` reads the body, keys the user's bucket, picks
a version (half to each at share 0.5), rewrites the model, counts the answer in its live
figures and adds the headers. ``off``: each request with the fleet's admin key, which the
middleware passes through untouched (no split, no counting), naming ``name@canary`` for half
of them at random -- so a batch mixes two LoRAs as often as under the split, and what is
measured is the split, not the cost of serving a canary beside production (which any
canary has, however it is routed). A replica without the middleware would be a second
process on other memory and another core's luck; asking one replica both ways takes the
engine, the batch and the host out of the comparison. Blocks of each alternate ABBA so a
drift of the shared host hits both alike; throughput is answers per second of a block,
latency each request's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from bench.timing import summarize
from bench.traffic_clients import Answer, UserLoop
from loragate.registry.rules.fleet import qualified_name

SHARE = 0.5
PEER = (
    "the same replica and adapter (both versions warm, share 0.5), blocks interleaved ABBA: "
    "on = requests as fresh users through the split and its metrics; off = requests with the "
    "fleet admin key, which TrafficSplit passes through untouched (no split, no counting), "
    "half of them naming name@canary at random: the same mix of versions in the engine"
)


def _block(
    url: str, model: str, prompt: str, max_tokens: int, clients: int, seconds: float, admin_key: str | None, canary: str
) -> tuple[list[Answer], float]:
    loop = UserLoop(
        url, model, prompt, max_tokens, threads=clients, admin_key=admin_key, deadline_s=seconds + 120,
        keyed_canary=qualified_name(model, canary), keyed_canary_share=SHARE,
    )  # fmt: skip
    with loop.running():
        started = time.perf_counter()
        time.sleep(seconds)
    # the answers that ended inside the block: the ones in flight when it closed are not its own
    inside = [a for a in loop.answers if started <= a.started and a.ended <= started + seconds]
    return inside, seconds


def bench_cost(
    url: str,
    model: str,
    prompt: str,
    max_tokens: int,
    admin_key: str,
    canary: str,
    clients: int,
    rounds: int,
    block_s: float,
    log: Callable[[str], None],
) -> dict[str, Any]:
    keys = {"on": None, "off": admin_key}
    _block(url, model, prompt, max_tokens, clients, min(block_s, 2.0), None, canary)  # warm-up, both versions
    answers: dict[str, list[Answer]] = {"on": [], "off": []}
    seconds = {"on": 0.0, "off": 0.0}
    per_block: dict[str, list[float]] = {"on": [], "off": []}
    for r in range(rounds):
        for mode in ("on", "off") if r % 2 == 0 else ("off", "on"):
            got, took = _block(url, model, prompt, max_tokens, clients, block_s, keys[mode], canary)
            answers[mode] += got
            seconds[mode] += took
            per_block[mode].append(round(sum(a.ok for a in got) / took, 2))
    result: dict[str, Any] = {
        "peer": PEER,
        "clients": clients,
        "rounds": rounds,
        "block_s": block_s,
        "max_tokens": max_tokens,
    }
    for mode in ("on", "off"):
        done = [a for a in answers[mode] if a.ok]
        result[mode] = {
            "requests_per_s": round(len(done) / seconds[mode], 2) if seconds[mode] else None,
            "per_block_requests_per_s": per_block[mode],
            **(summarize([int(a.seconds * 1e9) for a in done]) if done else {"n": 0}),
            "failed": len(answers[mode]) - len(done),
            "canary_share": round(sum(a.version == canary for a in done) / len(done), 3) if done else None,
        }
    on, off = result["on"], result["off"]
    if on.get("n") and off.get("n"):
        result["throughput_ratio"] = round(on["requests_per_s"] / off["requests_per_s"], 4)
        result["added_p50_ms"] = round(on["p50_ms"] - off["p50_ms"], 3)
        result["added_p99_ms"] = round(on["p99_ms"] - off["p99_ms"], 3)
    log(
        f"cost: on {on.get('requests_per_s')} req/s p50 {on.get('p50_ms')} ms, off {off.get('requests_per_s')} req/s "
        f"p50 {off.get('p50_ms')} ms; ratio {result.get('throughput_ratio')}"
    )
    return result
