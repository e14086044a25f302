"""What a local replica's live split (the plugin's ``TrafficSplit``) is started with.

A replica with a secrets directory runs the split after the admin guard (the outer one, so
it answers its own ``/loragate/*`` endpoints): told the base model it falls back to, the
replica's URL for its figures and the knobs it was given.

A replica of tests, benchmarks or the demo given a faults file runs the test fault injector
instead: ``loragate_faults.FaultInjectingSplit`` (``kit/replica_faults/``), the plugin's split
with the faults that file names injected. It is no part of the plugin installed in
``.venv-vllm`` or on any replica: that replica alone finds it, its ``PYTHONPATH`` being the
injector's folder, and is told the file in ``LORAGATE_REPLICA_FAULTS``.
"""

from __future__ import annotations

from pathlib import Path

from loragate.registry.errors import ErrorCode, InvalidInput

TRAFFIC_SPLIT = "loragate_resolver.traffic.TrafficSplit"
# the test fault injector and the folder that holds it, in the repository and out of every
# installed package: a replica without a faults file can never import it
FAULT_INJECTING_SPLIT = "loragate_faults.FaultInjectingSplit"
FAULTS_ROOT = Path(__file__).resolve().parents[2] / "kit" / "replica_faults"
FAULTS_VARIABLE = "LORAGATE_REPLICA_FAULTS"
# the split's knobs a replica may be given (VllmReplica.traffic_env)
TRAFFIC_KNOBS = frozenset(
    {
        "LORAGATE_ROUTES_REFRESH_S",
        "LORAGATE_BREAKER_ERRORS",
        "LORAGATE_BREAKER_SLOW",
        "LORAGATE_BREAKER_COOLDOWN_S",
        "LORAGATE_FEEDBACK_TTL_S",
        "LORAGATE_MIN_RESIDENCY_S",
        "LORAGATE_EVICTIONS_PER_MINUTE",
        "LORAGATE_BASE_PROBE_S",
        # not the split's but the plugin's: vLLM's own CPU LoRA ops, bench/fallback_bytes.py's baseline
        "LORAGATE_CPU_LORA_OPS",
    }
)


def split_middleware(faults_file: Path | None) -> str:
    """The split's ``--middleware``: the plugin's own, or the test fault injector's with a faults file."""
    return TRAFFIC_SPLIT if faults_file is None else FAULT_INJECTING_SPLIT


def split_environment(served_name: str, url: str, knobs: dict[str, str], faults_file: Path | None) -> dict[str, str]:
    """The split's environment variables; with a faults file, the injector's too.

    Raises:
        InvalidInput: INVALID_SETTING, a knob the split does not read.
    """
    unknown = sorted(set(knobs) - TRAFFIC_KNOBS)
    if unknown:
        raise InvalidInput(
            f"not a traffic split setting: {', '.join(unknown)}", code=ErrorCode.INVALID_SETTING, field="traffic_env"
        )
    env = {"LORAGATE_BASE_MODEL_NAME": served_name, "LORAGATE_REPLICA_URL": url, **knobs}
    if faults_file is not None:
        # the replica inherits no PYTHONPATH (replica_environment): this is all of it
        env["PYTHONPATH"] = str(FAULTS_ROOT)
        env[FAULTS_VARIABLE] = str(faults_file)
    return env
