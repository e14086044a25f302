"""One version through the pipeline's gates, as ``make demo`` follows and shows it: the
training event, registration, shadow validation (its regression line and weight scan), the
canary switch and each scheduled observation of its window, the promotion waiting for a
sign-off -- a forged one through the Prefect API refused first, when asked, and the pipeline
workers' own tokens refused a direct move -- then a person's sign-off from the CLI and
production switched in place. ``kit/demo.py`` fills in who holds which token (``PEOPLE``,
``POOL_TOKENS``) before the first version goes through.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kit.demo_console import banner, loragate, say, wait_for
from kit.demo_registry import SUPPORT, registry, stage_of, version_of, window_status

WINDOW_S = 30
# evaluations every few seconds are each a flow run, most cancelled while the last one runs:
# on two cores they crowd out the gates the demo follows
EVALUATE_EVERY_S = 10
# the always-on traffic watch (prefect.yaml: every minute)
WATCH_EVERY_S = 60
# activation tokens of the people who sign off
PEOPLE: dict[str, str] = {}
POOL_TOKENS: dict[str, str] = {}  # what each work pool's worker holds, by role


def flow_runs(pipeline, flow_name: str) -> list[Any]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName
    from prefect.settings import temporary_settings

    with temporary_settings(pipeline.server.client_settings()), get_client(sync_client=True) as client:
        return client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=[flow_name])))


def rejected_at_register(pipeline) -> str | None:
    for run in flow_runs(pipeline, "register"):
        if run.state_type is not None and run.state_type.value == "FAILED":
            return run.state.message if run.state else "failed"
    return None


def follow_canary(version_id: str) -> str | None:
    """Print each new observation of the version's window; the promotion run once it waits."""
    status, seen, run_id = window_status(version_id)
    if seen > follow_canary.shown:  # type: ignore[attr-defined]
        with registry() as reg:
            w = reg.latest_canary_window(version_id)
            for o in reg.canary_observations(w.id)[follow_canary.shown :]:  # type: ignore[attr-defined]
                say(
                    f"observation: canary {o.canary.errors}/{o.canary.requests} errors, p95 {o.canary.p95_ms} ms; "
                    f"production {o.production.errors}/{o.production.requests}, p95 {o.production.p95_ms} ms; "
                    f"drift {o.drift:.2f} -> {o.verdict.value}"
                )
        follow_canary.shown = seen  # type: ignore[attr-defined]
    return run_id if status == "ready" and run_id else None


def _regression_line(regression: dict) -> str:
    if regression["skipped"]:
        return f"regression check skipped ({regression['skipped']})"
    overall = regression["overall"]
    regressed = [c["slice"] for c in [overall, *regression["slices"]] if c["regressed"]]
    return (
        f"golden pass rate {overall['before']:.2f} on {regression['production_version']} -> {overall['after']:.2f}, "
        + (f"regressed: {', '.join(regressed)}" if regressed else "no slice regressed")
    )


def forged_sign_off_refused(pipeline, run_id: str, version: str) -> None:
    """What anyone who reaches the Prefect API could try: resume the paused promotion in
    alice's name with a made-up approval code. The flow refuses it and waits again."""
    from uuid import UUID

    from prefect.flow_runs import resume_flow_run
    from prefect.settings import temporary_settings

    banner("a forged sign-off: the Prefect API resumes the run as alice, with a made-up code")
    forged = {"approve": True, "reviewer": "alice", "comment": "ship it", "code": "lac_" + "0" * 12 + "_" + "A" * 22}
    with temporary_settings(pipeline.server.client_settings()):
        resume_flow_run(UUID(run_id), run_input=forged)

    def refusal() -> str | None:
        with registry() as reg:
            found = [e for e in reg.history(SUPPORT) if e.action == "approval_refused" and e.version_id == version]
        return found[-1].reason if found else None

    def paused_again() -> bool:
        runs = flow_runs(pipeline, "promote")
        return any(str(r.id) == run_id and r.state_type is not None and r.state_type.value == "PAUSED" for r in runs)

    say(f"refused before anything moved: {wait_for('the refusal', refusal, timeout_s=120)}")
    wait_for("the promote run waits for a sign-off again (the refusal is its artifact too)", paused_again)
    banner("code run on the release worker: its own (pipeline) token promotes directly, with no sign-off")
    as_release = {**pipeline.env, "LORAGATE_TOKEN": POOL_TOKENS["activation"]}
    loragate("promote", version, "--to", "production", expect=3, env=as_release)
    loragate("approve-code", version, expect=3, env=as_release)
    banner("code run on the fleet worker: its fleet token mints no token and signs nothing off")
    for argv in (("token", "create", "--role", "activation", "--holder", "mallory"), ("approve-code", version)):
        loragate(*argv, expect=3, env={**pipeline.env, "LORAGATE_TOKEN": POOL_TOKENS["fleet"]})


def through_the_pipeline(
    pipeline, bundle: Path, golden: Path, ui_url: str, label: str, *, forge: bool = False, users: Any = None
) -> str:
    banner(f"{label}: training finished -> register -> shadow-validate -> canary")
    loragate(
        "training-completed",
        str(bundle),
        "--name",
        SUPPORT,
        "--golden-set",
        str(golden),
        "--metadata",
        json.dumps({"job": label, "bundle": bundle.name}),
        env=pipeline.env,
    )
    version = wait_for("registered by the register flow", lambda: version_of(SUPPORT, bundle))
    say(f"version {version}")
    wait_for("shadow validation passed on the gpu pool", lambda: stage_of(version)[1] == "passed")
    report = json.loads(loragate("show", version, "--json", quiet=True))["manifest"]["validation_report"]
    say(f"against production: {_regression_line(report['regression'])}; weight scan: {report['scan']['action']}")
    wait_for("canary flow switched the canary replica and opened the window", lambda: stage_of(version)[0] == "canary")
    banner(f"{label}: scheduled canary evaluations every {EVALUATE_EVERY_S}s, window {WINDOW_S}s")
    follow_canary.shown = 0  # type: ignore[attr-defined]
    run_id = wait_for(
        "window in band for its whole length; the promote flow waits for a sign-off",
        lambda: follow_canary(version),
        timeout_s=300,
    )
    if users is not None:
        users.report(WINDOW_S, f"{label}'s canary window")
    say(f"a person signs off in the Prefect UI ({ui_url}/runs/flow-run/{run_id}) with `loragate approve-code`")
    loragate("canary", "show", version)
    if forge:
        forged_sign_off_refused(pipeline, run_id, version)
    banner(f"{label}: sign-off from the CLI (the same pause the UI form resumes, with a code of alice's own)")
    as_alice = {**pipeline.env, "LORAGATE_TOKEN": PEOPLE["alice"]}
    loragate("approve", version, "--comment", f"{label}: canary clean", env=as_alice)
    wait_for(
        "promoted: production replica switched in place and verified", lambda: stage_of(version)[0] == "production"
    )
    return version
