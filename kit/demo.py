"""`make demo`: the promotion pipeline end to end, on embedded defaults.

Builds a tiny Llama base and trains tenant adapters offline (good ones, one with a renamed
layer prefix the registry refuses at the door, one whose 4-bit compute dtype overflows,
which only shadow validation sees). Starts the local stack's Prefect server (its state on
the machine's Postgres, which ``make demo`` starts first) with loragate's deployments, a
worker per work pool (each holding only its role's token, never on the Prefect server) and
two vLLM CPU replicas (canary, production), with a dozen users looping on production
(``demo_traffic``). Then it emits ``loragate.training.completed`` events and follows each
gate: register, shadow validation (which signs what passed), canary -- half the users'
requests answered by it, sticky per user --, the scheduled evaluations, the promotion
waiting for a sign-off -- a forged one through the Prefect API refused, the release worker's
own token refused a direct move, then alice's from the CLI with an approval code of her own
--, production switched in place, a rollback that only moves users to the previous version
kept warm, a canary rolled back on its users' failed requests alone, and a replica copy
tampered on disk (seen by ``fleet status``, answered by the base, repaired by ``fleet
reconcile``). It ends with a summary and stops what it started, also on Ctrl-C. History
stays under ``.loragate/``; ``make ui`` reopens the Prefect UI on it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from kit.demo_console import HOME, STARTED, banner, loragate, say, wait_for
from kit.demo_gates import (
    EVALUATE_EVERY_S,
    PEOPLE,
    POOL_TOKENS,
    WATCH_EVERY_S,
    WINDOW_S,
    flow_runs,
    rejected_at_register,
    through_the_pipeline,
)
from kit.demo_registry import SUPPORT, registry, stage_of, version_of

MODELS = HOME / "demo-models"


def build_models() -> dict[str, Path]:
    from kit import corpus
    from kit.basekit import build_base
    from kit.modelkit import train_adapter
    from kit.tenant_tasks import write_golden_set

    MODELS.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    base = build_base(MODELS / "tiny-llama")
    say(f"built the tiny Llama base (hidden 128, 2 heads x 64, 2 layers) in {time.perf_counter() - t0:.1f}s")
    bundles = {"base": base}
    for key, seed in (("support-v1", 0), ("support-v2", 1), ("support-v3", 2)):
        t0 = time.perf_counter()
        bundles[key] = train_adapter(base, "support", MODELS / key, seed=seed)
        loss = json.loads((bundles[key] / "manifest.json").read_text())["training_metadata"]["final_loss"]
        say(f"trained {key} in {time.perf_counter() - t0:.1f}s, final loss {loss}")
    bundles["renamed-prefix"] = corpus.renamed_layer_prefix(bundles["support-v1"], MODELS / "renamed-prefix")
    bundles["fp16-qlora"] = corpus.large_activations(bundles["support-v2"], MODELS / "fp16-qlora", "float16")
    say("made two broken ones: a renamed layer prefix (PEFT would load it with no effect) and float16 compute on")
    say("a 4-bit base that overflows to NaN (only a forward pass shows it)")
    bundles["golden"] = write_golden_set("support", HOME / "golden-support.jsonl")
    return bundles


def summary(pipeline) -> None:
    banner("summary")
    with registry() as reg:
        versions = reg.list_versions()
        print(f"{'version':<32} {'stage':<12} {'validation':<10} canary window")
        for v in versions:
            windows = reg.canary_windows(None, version_id=v.version_id)
            w = (
                f"{windows[-1].status.value}, {len(reg.canary_observations(windows[-1].id))} observations"
                if windows
                else "-"
            )
            print(f"{v.version_id:<32} {v.stage.value:<12} {v.validation_status.value:<10} {w}")
        adapter = reg.get_adapter(SUPPORT)
        print(f"\n{SUPPORT}: production {adapter.production}, previous {adapter.previous}, canary {adapter.canary}")
        decisions = [e for e in reg.history(SUPPORT) if e.action == "approval"]
        for e in decisions:
            print(f"sign-off: {e.version_id} {e.to_value} by {e.details['reviewer']} (token {e.details['token_id']})")
    print("\nflow runs:")
    for name in ("register", "shadow-validate", "canary", "canary-evaluate", "promote", "rollback", "traffic-watch"):
        runs = flow_runs(pipeline, name)
        states: dict[str, int] = {}
        for r in runs:
            states[r.state_name or "?"] = states.get(r.state_name or "?", 0) + 1
        print(f"  {name:<16} " + ", ".join(f"{n} {s}" for s, n in sorted(states.items())))


def main() -> None:
    from kit.demo_replicas import ask, demo_replica_secrets, direct_load_refused, tampered_copy_repaired
    from kit.demo_traffic import LoopingUsers, live_errors_rolled_back
    from loragate.local.pipeline import POOLS, PipelineSecrets, start_pipeline
    from loragate.local.prefect_local import start_local_prefect_server
    from loragate.local.replica import VllmReplica, start_replicas, stop_replicas
    from loragate.local.replica_secrets import hand_admin_key
    from loragate.registry.rules.access import Role

    if HOME.exists():
        shutil.rmtree(HOME)
    HOME.mkdir()
    settings_env = {
        "LORAGATE_HOME": str(HOME),
        "LORAGATE_ACTOR": "demo",
        "HF_HUB_OFFLINE": "1",
        "LORAGATE_CANARY_WINDOW_S": str(WINDOW_S),
        # two replicas, five workers and a server share two cores: a p95 of a few requests
        # swings by half a second here -- the machine, not the adapter (errors and drift stay
        # strict; the latency rule is a row of tests/test_canary_verdict.py's table)
        "LORAGATE_CANARY_P95_SLACK_MS": "3000",
        "LORAGATE_APPROVAL_POLL_S": "1",
        # half the users on the canary, so a few dozen requests show the split; the looping
        # users bring the live requests a window needs
        "LORAGATE_CANARY_SHARE": "0.5",
        "LORAGATE_CANARY_MIN_LIVE_REQUESTS": "20",
        # a few dozen requests cannot show a canary failing 2x as often as production (that
        # takes thousands: docs/live-traffic.md); the demo's window asks for its minimum alone
        "LORAGATE_CANARY_DETECT_RATIO": "0",
    }
    os.environ.update(settings_env)
    for var in ("LORAGATE_DATABASE_URL", "LORAGATE_ARTIFACTS"):
        os.environ.pop(var, None)

    banner("model kit: tiny base and adapters, offline")
    m = build_models()

    banner("registry: init (the first admin token), pin the base")
    loragate("init")
    as_admin = {"LORAGATE_TOKEN": (HOME / "admin.token").read_text().strip()}
    loragate("base", "add", str(m["base"]), "--id", "tiny-llama", env=as_admin)

    banner("who may do what: a token per gate role, one for the person who signs off, a signing key")
    tokens = {}
    for role in sorted({pool.role for pool in POOLS}):  # admin is the person here, on no worker
        made = loragate(
            "token",
            "create",
            "--role",
            role.value,
            "--holder",
            f"pipeline-{role.value}",
            "--pipeline",
            "--json",
            quiet=True,
            env=as_admin,
        )
        tokens[role] = json.loads(made)["token"]
    POOL_TOKENS.update({role.value: token for role, token in tokens.items()})
    PEOPLE["alice"] = json.loads(
        loragate("token", "create", "--role", "activation", "--holder", "alice", "--json", quiet=True, env=as_admin)
    )["token"]
    say("tokens are shown once; each work pool's worker gets its role's token in a directory of its own,")
    say("never on the Prefect server (no Secret block, parameter, variable or log holds one):")
    loragate("token", "list", env=as_admin)
    keys = HOME / "keys"
    loragate("key", "generate", "--out", str(keys))
    loragate("key", "add", str(keys / "signing.pub"), "--role", "signing", "--holder", "pipeline", env=as_admin)

    replica_secrets, admin_key = demo_replica_secrets()  # the replicas obey only the fleet
    replicas = [
        VllmReplica(
            m["base"],
            "tiny-llama",
            adapter_dir=HOME / "adapters",
            role=role,
            secrets_dir=replica_secrets,
            log_path=HOME / f"replica-{role}.log",
            die_with_parent=True,
            faults_file=HOME / "replica-faults.json",
        )
        for role in ("production", "canary")
    ]
    pipeline = users = None
    try:
        banner("start: Prefect server, deployments, workers; two vLLM CPU replicas (about a minute)")
        import concurrent.futures

        # the replicas die with the thread that starts them (PR_SET_PDEATHSIG): the main one
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            server_f = pool.submit(start_local_prefect_server, HOME / "prefect", 4200, database="loragate_demo_prefect")
            start_replicas(replicas)
            server = server_f.result()
        ui = server.ui_url
        os.environ["LORAGATE_UI_URL"] = ui
        settings_env["LORAGATE_UI_URL"] = ui
        secrets = PipelineSecrets(tokens, (keys / "signing.key").read_bytes())
        pipeline = start_pipeline(
            HOME / "prefect",
            settings_env,
            secrets,
            evaluate_every_s=EVALUATE_EVERY_S,
            watch_every_s=WATCH_EVERY_S,
            server=server,
        )
        pipeline.owns_server = True
        hand_admin_key(pipeline.secret_dirs, admin_key)  # canary, release and fleet pools only
        deployments = "register, shadow-validate, canary, canary-evaluate, promote, rollback, traffic-watch"
        say(f"Prefect UI: {ui}  (deployments: {deployments})")
        say(f"the server has API authentication on: log in with the credential in {server.home}/api-auth")
        for r in replicas:
            loragate(
                "fleet",
                "add",
                r.url,
                "--base",
                "tiny-llama",
                "--role",
                r.role,
                "--adapter-dir",
                str(HOME / "adapters"),
                env=as_admin,
            )
        urls = {r.role: r.url for r in replicas}

        banner("a broken adapter: rejected at register, with its diagnostic")
        loragate(
            "training-completed",
            str(m["renamed-prefix"]),
            "--name",
            SUPPORT,
            "--golden-set",
            str(m["golden"]),
            env=pipeline.env,
        )
        message = wait_for("register flow failed", lambda: rejected_at_register(pipeline))
        say(f"why: {message}")

        v1 = through_the_pipeline(pipeline, m["support-v1"], m["golden"], ui, "support v1", forge=True)
        prompt = json.loads(m["golden"].read_text().splitlines()[0])["prompt"]
        ask(urls, prompt)
        banner("users: a dozen of them loop on the production replica; every answer names its version")
        users = LoopingUsers(urls["production"], SUPPORT, prompt).start()
        users.show_one()
        banner("separation of duties: a training token cannot touch production")
        loragate("rollback", SUPPORT, "--stage", "production", expect=3, env={"LORAGATE_TOKEN": tokens[Role.TRAINING]})
        loragate("verify", v1)

        banner("a broken adapter that registers fine: shadow validation fails it")
        loragate("training-completed", str(m["fp16-qlora"]), "--name", SUPPORT, env=pipeline.env)
        bad = wait_for("registered", lambda: version_of(SUPPORT, m["fp16-qlora"]))
        wait_for(
            "validation failed; the version is rejected and never reaches canary",
            lambda: stage_of(bad)[0] == "rejected",
        )
        shown = json.loads(loragate("show", bad, "--json", quiet=True))
        for failure in shown["manifest"]["validation_report"]["failures"]:
            say(f"why: {failure}")

        v2 = through_the_pipeline(pipeline, m["support-v2"], m["golden"], ui, "support v2", users=users)
        ask(urls, prompt)

        banner("rollback: production back to the previous version, kept warm: the users move, nothing reloads")
        say("the rollback deployment moves nothing without a rollback code a person got with their own token:")
        made = loragate("approve-code", v2, "--rollback", "--json", quiet=True, env={"LORAGATE_TOKEN": PEOPLE["alice"]})
        params = {"name": SUPPORT, "expected_version": v2, "reason": "tenant reports regressions"}
        args = [f"{k}={v}" for k, v in {**params, "code": json.loads(made)["code"]}.items()]
        prefect_bin = str(Path(sys.executable).parent / "prefect")
        run = [prefect_bin, "deployment", "run", "rollback/rollback", *(a for p in args for a in ("--param", p))]
        subprocess.run(run, env={**os.environ, **pipeline.env}, check=True, capture_output=True)
        wait_for(f"rollback flow: production is {v1} again", lambda: stage_of(v1)[0] == "production")
        time.sleep(3)
        users.report(3, "after the rollback")
        live_errors_rolled_back(pipeline, m["support-v3"], m["golden"], users, HOME / "replica-faults.json")

        banner("a direct load on a replica, without the fleet's admin key: refused")
        direct_load_refused(urls["production"], SUPPORT, v2)
        ask(urls, prompt)

        banner("a replica copy tampered on disk: fleet status sees it, the resolver refuses it, reconcile repairs it")
        tampered_copy_repaired(urls, SUPPORT, v1, prompt, {"LORAGATE_TOKEN": tokens[Role.FLEET]})
        ask(urls, prompt)
        loragate("history", SUPPORT)
        summary(pipeline)
    finally:
        banner("stop everything this demo started")
        if users is not None:
            users.stop()
        if pipeline is not None:
            pipeline.stop()
        stop_replicas(replicas)
    took = time.monotonic() - STARTED
    print(f"\ndemo finished in {took:.0f}s; history under {HOME} -- `make ui` reopens the Prefect UI on it")


def _interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt  # SIGTERM unwinds like Ctrl-C: every `finally` stops what it started


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        main()
    except KeyboardInterrupt:
        print("\ninterrupted: every process the demo started was stopped", file=sys.stderr)
        sys.exit(130)
