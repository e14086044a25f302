"""What every fleet benchmark starts from (``bench/fleet.py``, ``fleet_load.py``,
``fleet_restart.py``, ``fleet_prefect.py``, ``stuck.py``): a registry holding one adapter
name with two signed, validated versions that answer a probe prompt differently, so any
replica's answer says which version it serves; the fleet of replicas it is made to drive;
and the moves they time on it, ``loragate rollback`` as a process of its own among them.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kit.basekit import build_base
from kit.modelkit import train_adapter
from kit.tenant_tasks import golden_cases
from loragate.registry.rules.access import Principal
from loragate.registry.service import Registry
from loragate.registry.settings import Settings
from loragate.registry.storage.signing import KeyPair, generate_key_pair
from loragate.tasks.fleet import promote_and_switch, rollback_and_switch
from loragate.tasks.reconcile import reconcile_fleet
from loragate.tasks.validation import ValidationPolicy, validate_versions

BASE_ID = "tiny-llama"
# the replicas' logs outlive the run: what an engine said when a section failed
LOGS = Path(__file__).resolve().parent / "out" / "fleet-logs"


def log(msg: str) -> None:
    print(f"[bench/fleet] {msg}", file=sys.stderr, flush=True)


def seconds(samples: list[float]) -> dict[str, Any]:
    return {
        "n": len(samples),
        "median_s": round(statistics.median(samples), 3),
        "max_s": round(max(samples), 3),
        "samples_s": [round(s, 3) for s in samples],
    }


@dataclass
class Setup:
    registry: Registry
    settings: Settings
    base: Path
    name: str
    v1: str
    v2: str
    prompt: str
    max_tokens: int
    # what each version answers the prompt, as shadow validation recorded it
    answers: dict[str, str]
    # the key that signed both versions (a benchmark that registers more signs them with it)
    key: KeyPair = field(repr=False)

    def production(self) -> str:
        pointers = self.registry.get_adapter(self.name)
        assert pointers.production is not None
        return pointers.production

    def previous(self) -> str:
        return self.v1 if self.production() == self.v2 else self.v2

    def env(self) -> dict[str, str]:
        """The settings a ``loragate`` command or a worker needs to reach this registry."""
        return {
            "LORAGATE_HOME": str(self.settings.home),
            "LORAGATE_DATABASE_URL": self.settings.database_url,
            "LORAGATE_ARTIFACTS": self.settings.artifacts,
            "LORAGATE_ACTOR": "bench",
        }


def build_setup(work: Path, base: Path | None, database_url: str | None = None, **settings_: Any) -> Setup:
    log("building the tiny base and training two adapters (support, tickets)")
    base = base or build_base(work / "tiny-llama")
    support = train_adapter(base, "support", work / "support")
    tickets = train_adapter(base, "tickets", work / "tickets")
    settings = Settings(
        home=work / "home",
        database_url=database_url or f"sqlite:///{work / 'registry.db'}",
        artifacts=str(work / "artifacts"),
        actor="bench",
        **settings_,
    )
    registry = Registry.open(settings, check_schema=False, principal=Principal.in_process("bench"))
    registry.init()
    registry.add_base(str(base), BASE_ID)
    name = f"bench{uuid.uuid4().hex[:6]}/{BASE_ID}/support"
    v1 = registry.register_adapter(support, name).version.version_id
    v2 = registry.register_adapter(tickets, name).version.version_id
    golden = work / "golden.jsonl"
    # four cases of each task: each version passes half, and its answers tell which it is
    cases = golden_cases("support")[:4] + golden_cases("tickets")[:4]
    golden.write_text("".join(json.dumps(c) + "\n" for c in cases))
    registry.attach_golden_set(name, golden)
    log("shadow-validating both versions")
    reports = validate_versions(registry, [v1, v2], ValidationPolicy.from_settings(settings, pass_threshold=0.5))
    if [r.status for r in reports] != ["passed", "passed"]:
        raise SystemExit(f"bench: the two versions did not pass validation: {[r.failures for r in reports]}")
    # production takes a signing key's signature
    key = generate_key_pair()
    registry.add_signing_key(key.public_pem, "signing", "bench")
    answers = {}
    for version in (v1, v2):
        registry.sign_version(version, key.private_pem)
        expected = registry.expected_outputs(version)
        assert expected is not None
        answers[version] = expected[1]["support-0"].strip()
    if answers[v1] == answers[v2]:
        raise SystemExit("bench: both versions answer the probe prompt alike; nothing would be measured")
    case = next(c for c in cases if c["id"] == "support-0")
    return Setup(registry, settings, base, name, v1, v2, case["prompt"], case.get("max_tokens", 32), answers, key)


def use_fleet(setup: Setup, urls: list[str], adapter_dir: Path) -> None:
    """Make exactly ``urls`` the fleet of production replicas, in sync with the pointers."""
    for replica in setup.registry.list_replicas():
        setup.registry.remove_replica(replica.url)
    for url in urls:
        setup.registry.add_replica(url, BASE_ID, "production", str(adapter_dir))
    states = reconcile_fleet(setup.registry)
    failed = [s.error for s in states if s.error or not s.reachable]
    if failed:
        raise SystemExit(f"bench: the fleet could not be reconciled: {failed}")


def rollback(setup: Setup) -> list[dict[str, Any]]:
    _, report = rollback_and_switch(setup.registry, setup.name, "production", reason="bench")
    return report


def promote_back(setup: Setup) -> list[dict[str, Any]]:
    """After a rollback the other version is rolled back: it goes through canary again."""
    version = setup.previous()
    promote_and_switch(setup.registry, version, "canary")
    _, report = promote_and_switch(setup.registry, version, "production")
    return report


def bench_cli_rollback(setup: Setup) -> float:
    """``loragate rollback`` as a user runs it: a process of its own, imports included."""
    env = {**os.environ, **setup.env(), "LORAGATE_TOKEN": setup.registry.create_token("activation", "bench")[1]}
    command = [str(Path(sys.executable).parent / "loragate"), "rollback", setup.name, "--json"]
    started = time.perf_counter()
    proc = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    took = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"bench: loragate rollback exited {proc.returncode}: {proc.stderr[-2000:]}")
    promote_back(setup)
    return took


def check_verified(report: list[dict[str, Any]], replicas: int) -> None:
    if len(report) != replicas or not all(r["verified"] for r in report):
        raise SystemExit(f"bench: a switch did not verify every replica: {report}")
