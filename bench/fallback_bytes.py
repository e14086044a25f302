"""Every answer is produced by the bytes its label names (docs/benchmarks/fallback-bytes.md):
its version's, or the base's, on one production replica short of memory.

K adapters in production on the tiny base, each registering one of two or more bundles
trained to distinct answers (``support``'s " ACME-OK: ...", ``tickets``' JSON), each with its
own prompt. The replica has few slots (``--max-loras 2 --max-cpu-loras 4``) and the guard's
cap (5 evictions a minute, no minimum residency): once the cap is spent, requests for
adapters not resident are answered by the base (``x-loragate-fallback``) in the same batches
as the admitted ones. ``--clients`` threads send the Zipf schedule through the live split,
every fourth request names the base itself, and one more client holds a long answer of the
hottest adapter for the whole run, so that every batch mixes the base's rows with an
adapter's.

Each answer's text (greedy, 8 tokens) is compared with what its label's bytes answer alone:
the base's answer to that prompt (the base asked alone, before the traffic), or its version's
behaviour's (one adapter of that behaviour asked alone). Ways, the same registry, schedule
and seed each:

- ``guarded``: the plugin as it ships (``cpu_lora_ops`` keeps every adapter's delta off the
  base's rows);
- ``vllm_ops``: vLLM 0.32's own CPU LoRA ops (``LORAGATE_CPU_LORA_OPS=vllm``), the baseline:
  a base row gets the delta of the adapter in the last slot.

``--smoke``: 8 adapters, 1,200 requests, the ``guarded`` way only.

    .venv/bin/python -m bench.fallback_bytes [--adapters 50] [--requests 3000] [--clients 8]
                                             [--ways guarded vllm_ops] [--base DIR]
                                             [--bundles DIR DIR ...] [--smoke] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench import residency_workload as workload
from bench.harness import emit, fleet_replica, work_directory
from bench.scale_restart import registry_with_production
from kit.basekit import build_base
from kit.modelkit import train_adapter
from kit.postgres import admin_engine, drop_database
from kit.tenant_tasks import TASKS, prompt_for, write_golden_set
from loragate.registry.service import Registry
from loragate.tasks.reconcile import reconcile_fleet

BASE_ID = "tiny-llama"
SLOTS = {"max_loras": 2, "max_cpu_loras": 4}
GUARD = {"LORAGATE_MIN_RESIDENCY_S": "0"}  # the default cap: 5 evictions a minute
WAYS: dict[str, dict[str, str]] = {"guarded": {}, "vllm_ops": {"LORAGATE_CPU_LORA_OPS": "vllm"}}
TASK_ORDER = ("support", "tickets", "orders")
MAX_TOKENS = 8
HOLD_TOKENS = 200  # the holder's answer: long enough to share many batches
BASE_EVERY = 4  # every fourth request names the base itself
SEED = 11
TIMEOUT_S = 120.0


def log(message: str) -> None:
    print(f"[bench/fallback_bytes] {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Answer:
    asked: str  # the adapter name, or the base's
    task: str  # whose prompt
    label: str  # the version that answered (x-loragate-version), or "base"
    fallback: str | None
    status: int
    text: str | None


def complete(client: httpx.Client, model: str, task: str, user: str, max_tokens: int = MAX_TOKENS) -> Answer:
    body: dict[str, Any] = {
        "model": model,
        "prompt": prompt_for(task, TASKS[task]["examples"][0].query),
        "max_tokens": max_tokens,
        "temperature": 0,
        "user": user,
    }
    if max_tokens > MAX_TOKENS:
        body["ignore_eos"] = True
    response = client.post("/v1/completions", json=body)
    text = None
    if response.status_code == 200:
        text = response.json()["choices"][0]["text"]
    label = response.headers.get(workload.VERSION_HEADER) or "base"
    return Answer(model, task, label, response.headers.get(workload.FALLBACK_HEADER), response.status_code, text)


def references(url: str, tasks: dict[str, str], first_of: dict[str, str]) -> dict[tuple[str, str], str]:
    """(behaviour or "base", prompt's task) -> the text those bytes answer alone."""
    found: dict[tuple[str, str], str] = {}
    with httpx.Client(base_url=url, timeout=TIMEOUT_S) as client:
        for prompt_task in first_of:
            found[("base", prompt_task)] = _alone(complete(client, BASE_ID, prompt_task, "reference"))
            for behaviour, name in first_of.items():
                answer = complete(client, name, prompt_task, "reference")
                if answer.label == "base":
                    raise RuntimeError(f"{name} was answered by the base while its reference was taken")
                found[(behaviour, prompt_task)] = _alone(answer)
    return found


def _alone(answer: Answer) -> str:
    if answer.text is None:
        raise RuntimeError(f"{answer.asked} answered {answer.status} alone")
    return answer.text


def run(url: str, order: list[str], tasks: dict[str, str], clients: int) -> tuple[list[Answer], float, int]:
    """The schedule through the split from ``clients`` threads while one more holds a long
    answer of ``order``'s hottest adapter; (answers, seconds, held answers)."""
    hottest = Counter(order).most_common(1)[0][0]
    done = threading.Event()
    held = 0

    def hold() -> None:
        nonlocal held
        with httpx.Client(base_url=url, timeout=TIMEOUT_S) as client:
            while not done.is_set():
                complete(client, hottest, tasks[hottest], "holder", HOLD_TOKENS)
                held += 1

    local = threading.local()

    def one(i: int) -> Answer:
        if not hasattr(local, "client"):
            local.client = httpx.Client(base_url=url, timeout=TIMEOUT_S)
        name = order[i]
        model = BASE_ID if i % BASE_EVERY == BASE_EVERY - 1 else name
        return complete(local.client, model, tasks[name], f"user-{i % 50}")

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    time.sleep(0.5)
    started = time.monotonic()
    try:
        with ThreadPoolExecutor(clients) as pool:
            answers = list(pool.map(one, range(len(order))))
    finally:
        done.set()
        holder.join(TIMEOUT_S)
    return answers, time.monotonic() - started, held


def judge(answers: list[Answer], behaviour_of: dict[str, str], expected: dict[tuple[str, str], str]) -> dict[str, Any]:
    """Mismatches: an answer whose text is not what its label's bytes answer alone."""
    adapter_texts = {text for (who, _), text in expected.items() if who != "base"}
    mismatched, foreign, examples = 0, 0, []
    labels: Counter[str] = Counter()
    for a in answers:
        if a.text is None:
            continue
        who = "base" if a.label == "base" else behaviour_of.get(a.label, "?")
        labels["base" if who == "base" else "version"] += 1
        if a.text == expected.get((who, a.task)):
            continue
        mismatched += 1
        if who == "base" and a.text in adapter_texts:
            foreign += 1
        if len(examples) < 5:
            examples.append(
                {"asked": a.asked, "label": a.label, "text": a.text, "expected": expected.get((who, a.task))}
            )
    return {
        "requests": len(answers),
        "failed": sum(1 for a in answers if a.status != 200),
        "answered_by_versions": labels["version"],
        "answered_by_base": labels["base"],
        "fallbacks": sum(1 for a in answers if a.fallback),
        "fallback_reasons": sorted({a.fallback for a in answers if a.fallback}),
        "mismatched": mismatched,
        "base_labelled_with_an_adapters_text": foreign,
        "examples": examples,
    }


def one_way(
    registry: Registry, base_dir: Path, label: str, env: dict[str, str], order: list[str], work: Path, clients: int
) -> dict[str, Any]:
    pointers = registry.adapter_pointers()
    behaviour_of = {p.production: _behaviour(registry, p.production) for p in pointers if p.production}
    tasks = {p.name: behaviour_of[p.production] for p in pointers if p.production}
    first_of: dict[str, str] = {}
    for name in sorted(tasks):
        first_of.setdefault(tasks[name], name)
    with fleet_replica(registry, base_dir, BASE_ID, label, work, SLOTS, {**GUARD, **env}) as (replica, admin_key):
        reconcile_fleet(registry)
        expected = references(replica.url, tasks, first_of)
        log(f"{label}: references {expected}; {len(order)} requests from {clients} clients")
        answers, seconds, held = run(replica.url, order, tasks, clients)
        result = {**judge(answers, behaviour_of, expected), "held_answers": held, "seconds": round(seconds, 1)}
        result["requests_per_s"] = round(len(answers) / seconds, 1) if seconds else None
        figures = httpx.get(
            f"{replica.url}/loragate/traffic",
            params={"view": "alerts"},
            headers={workload.ADMIN_HEADER: admin_key},
            timeout=TIMEOUT_S,
        ).json()
        result["replica"] = {k: figures.get(k) for k in ("base_rows_guarded", "base_probe")}
        log(f"{label}: {result}")
        return result


def _behaviour(registry: Registry, version_id: str) -> str:
    """The task a version was trained on, from its manifest's training metadata."""
    task = (registry.get_version(version_id).manifest.get("training_metadata") or {}).get("task")
    if task not in TASKS:
        raise RuntimeError(f"{version_id}: no known task in its training metadata")
    return task


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--adapters", type=int, default=50)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--smoke", action="store_true", help="8 adapters, 1,200 requests, the guarded way only")
    parser.add_argument("--base", type=Path, help="the tiny base (else one is built)")
    parser.add_argument("--bundles", type=Path, nargs="+", help="trained bundles of the base, one per task")
    parser.add_argument("--ways", nargs="+", choices=sorted(WAYS), help="only these ways (default: all)")
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args()
    if args.smoke:
        args.adapters, args.requests = 8, 1200
        args.ways = args.ways or ["guarded"]
    if args.adapters < 2 or args.requests < 1 or args.clients < 1:
        parser.error("--adapters must be at least 2, --requests and --clients at least 1")
    wall = time.perf_counter()
    result: dict[str, Any] = {
        "benchmark": "fallback_bytes",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "smoke": args.smoke,
        "adapters": args.adapters,
        "slots": SLOTS,
        "guard": GUARD,
        "clients": args.clients,
    }
    with work_directory("loragate-bench-fallback-bytes-") as work:
        base_dir = args.base or build_base(work / "tiny-llama")
        bundles = args.bundles or [train_adapter(base_dir, t, work / t) for t in TASK_ORDER[:2]]
        behaviours = [(b, write_golden_set(_task_of(b), work / f"golden-{i}.jsonl")) for i, b in enumerate(bundles)]
        t = time.monotonic()
        registry, database = registry_with_production(
            work, base_dir, *behaviours[0], args.adapters, behaviours[1:], prefix="f"
        )
        result["setup_s"] = round(time.monotonic() - t, 1)
        try:
            names = sorted(a.name for a in registry.adapter_pointers())
            order = workload.schedule(names, args.requests, SEED)
            result["workload"] = {"requests": args.requests, "zipf_exponent": workload.ZIPF_EXPONENT, "seed": SEED}
            result["ways"] = {}
            for label in args.ways or list(WAYS):
                result["ways"][label] = one_way(registry, base_dir, label, WAYS[label], order, work, args.clients)
        finally:
            registry.close()
            drop_database(admin_engine(), database)
    result["wall_s"] = round(time.perf_counter() - wall, 1)
    emit(result, args.out)


def _task_of(bundle: Path) -> str:
    import json

    manifest = json.loads((bundle / "manifest.json").read_text())
    task = (manifest.get("training_metadata") or {}).get("task")
    if task not in TASKS:
        raise SystemExit(f"--bundles: {bundle} names no known task in its training metadata")
    return task


if __name__ == "__main__":
    main()
