"""`make demo`: the whole pipeline that exists today, end to end, on embedded defaults.

Builds a tiny Llama base and trains tenant adapters offline, then drives the real
``loragate`` command: catalogue the base, register adapters (one refused at the door),
attach golden sets, shadow-validate them in one batch (one fails for a silent reason),
promote through canary to production on two real vLLM CPU replicas (each promotion and the
rollback switches both in place and verifies what they serve), and show the audit trail.
Everything lives under ``demo-out/`` (SQLite registry, local artifact directory, replica
logs); the replicas are stopped when the demo ends, however it ends.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

OUT = Path("demo-out")
SUPPORT = "acme/tiny-llama/support"
TICKETS = "globex/tiny-llama/tickets"


def banner(text: str) -> None:
    print(f"\n=== {text} " + "=" * max(0, 70 - len(text)), flush=True)


def loragate(*args: str, expect: int = 0, quiet: bool = False) -> str:
    cmd = [str(Path(sys.executable).parent / "loragate"), *args]
    print("$ loragate " + " ".join(args), flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "LORAGATE_PROGRESS": "1"})
    if proc.stderr.strip():
        print("\n".join("  " + line for line in proc.stderr.strip().splitlines()))
    if proc.stdout.strip() and not quiet:
        print(proc.stdout.rstrip())
    if proc.returncode != expect:
        raise SystemExit(f"demo: `loragate {' '.join(args)}` exited {proc.returncode}, expected {expect}")
    return proc.stdout.strip()


def ask_replicas(urls: list[str], adapter: str, prompt: str) -> None:
    """What a tenant's client sees: a greedy completion from each replica, by logical name,
    and the version behind it (the adapter's path on the replica ends in its version id)."""
    import httpx

    for url in urls:
        cards = httpx.get(f"{url}/v1/models", timeout=60).json()["data"]
        served = next(Path(c["root"]).name for c in cards if c["id"] == adapter)
        body = {"model": adapter, "prompt": prompt, "max_tokens": 8, "temperature": 0}
        text = httpx.post(f"{url}/v1/completions", json=body, timeout=60).json()["choices"][0]["text"]
        print(f"  {url} serves {adapter} = {served}: {prompt!r} -> {text!r}")


def build_models() -> dict[str, Path]:
    from infra import corpus
    from infra.modelkit import build_base, train_adapter, write_golden_set

    models = OUT / "models"
    models.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    base = build_base(models / "tiny-llama")
    print(f"built tiny Llama base (hidden 128, 2 heads x 64, 2 layers) in {time.perf_counter() - t0:.1f}s")
    bundles = {}
    for key, task, seed in (("support-v1", "support", 0), ("tickets-v1", "tickets", 0), ("support-v2", "support", 1)):
        t0 = time.perf_counter()
        bundles[key] = train_adapter(base, task, models / key, seed=seed)
        loss = json.loads((bundles[key] / "manifest.json").read_text())["training_metadata"]["final_loss"]
        print(f"trained {key} ({task}) in {time.perf_counter() - t0:.1f}s, final loss {loss}")
    # silent failures: one the registry refuses at the door, one only validation can see
    bundles["renamed-prefix"] = corpus.renamed_layer_prefix(bundles["support-v1"], models / "renamed-prefix")
    bundles["fp16-qlora"] = corpus.large_activations(bundles["support-v2"], models / "fp16-qlora", "float16")
    bundles["base"] = base
    bundles["golden-support"] = write_golden_set("support", OUT / "golden-support.jsonl")
    bundles["golden-tickets"] = write_golden_set("tickets", OUT / "golden-tickets.jsonl")
    return bundles


def lifecycle(v1: str, t1: str, v2: str, bad: str, urls: list[str], prompt: str) -> None:
    banner("lifecycle: canary -> production on the replicas, a second version, rollback")
    loragate("promote", v1, "--to", "canary")
    loragate("promote", v1, "--to", "production", "--reason", "canary window clean")
    ask_replicas(urls, SUPPORT, prompt)
    loragate("promote", t1, "--to", "canary")
    print("the adapter that failed validation can never reach canary:")
    loragate("promote", bad, "--to", "canary", expect=2)
    loragate("promote", v2, "--to", "canary")
    print("production switches both replicas in place, then checks each serves v2's validated outputs:")
    loragate("promote", v2, "--to", "production", "--reason", "approved")
    loragate("fleet", "status")
    ask_replicas(urls, SUPPORT, prompt)
    loragate("rollback", SUPPORT, "--reason", "tenant reports regressions")
    resolved = loragate("resolve", SUPPORT)
    assert resolved == v1, "rollback restores the previous production version"
    loragate("fleet", "status")
    ask_replicas(urls, SUPPORT, prompt)
    loragate("history", SUPPORT)


def main() -> None:
    if OUT.exists():
        shutil.rmtree(OUT)
    OUT.mkdir()
    os.environ.update({"LORAGATE_HOME": str(OUT / ".loragate"), "LORAGATE_ACTOR": "demo", "HF_HUB_OFFLINE": "1"})
    os.environ.pop("LORAGATE_DATABASE_URL", None)
    os.environ.pop("LORAGATE_ARTIFACTS", None)

    banner("model kit: tiny base and tenant adapters, offline")
    m = build_models()

    banner("registry: init and pin the base")
    loragate("init")
    loragate("base", "add", str(m["base"]), "--id", "tiny-llama")

    banner("register adapters")
    v1 = loragate("register", str(m["support-v1"]), "--name", SUPPORT)
    t1 = loragate("register", str(m["tickets-v1"]), "--name", TICKETS)
    again = loragate("register", str(m["support-v1"]), "--name", SUPPORT)
    assert again == v1, "registering the same bytes twice returns the same version"
    print(f"(same bytes again -> same version {again}, nothing written)")
    v2 = loragate("register", str(m["support-v2"]), "--name", SUPPORT)
    bad = loragate("register", str(m["fp16-qlora"]), "--name", SUPPORT)
    print("a bundle whose layer prefix was renamed would load in PEFT with no effect; the registry refuses it:")
    loragate("register", str(m["renamed-prefix"]), "--name", SUPPORT, expect=2)
    loragate("list")

    banner("golden sets (checked by a great-expectations suite)")
    loragate("golden", "set", SUPPORT, str(m["golden-support"]))
    loragate("golden", "set", TICKETS, str(m["golden-tickets"]))

    banner("shadow validation: one base load, four adapters")
    loragate("validate", v1, t1, v2, bad, expect=1)
    loragate("list")
    prompt = json.loads(m["golden-support"].read_text().splitlines()[0])["prompt"]

    banner("fleet: two vLLM CPU replicas of the base (about a minute)")
    try:
        urls = loragate("replicas", "up", "--base", "tiny-llama", "--count", "2").split()
        lifecycle(v1, t1, v2, bad, urls, prompt)
    finally:
        banner("fleet: stop the replicas")
        loragate("replicas", "down")

    banner("materialize the production bundle for a replica")
    loragate("materialize", v1, str(OUT / "serve" / v1))
    report = json.loads(loragate("show", v2, "--json", quiet=True))["manifest"]["validation_report"]
    print(f"validation report of {v2}: {report['summary']}")

    banner("housekeeping: what crashed writes would have left")
    loragate("gc", "--dry-run")
    print(f"\ndemo finished: registry in {OUT / '.loragate'}, bundles in {OUT / 'models'}")


if __name__ == "__main__":
    main()
