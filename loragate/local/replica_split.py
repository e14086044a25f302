"""What a local replica's live split (the plugin's ``TrafficSplit``) is started with.

A replica with a secrets directory runs the split after the admin guard (the outer one, so
it answers its own ``/loragate/*`` endpoints): told the base model it falls back to, the
replica's URL for its figures, the knobs it was given and, for tests, benchmarks and the
demo, a faults file.
"""

from __future__ import annotations

from pathlib import Path

from loragate.registry.errors import ErrorCode, InvalidInput

TRAFFIC_SPLIT = "loragate_resolver.traffic.TrafficSplit"
FAULTS_VARIABLE = "LORAGATE_REPLICA_FAULTS"
# the split's knobs a replica may be given (VllmReplica.traffic_env)
TRAFFIC_KNOBS = frozenset(
    {
        "LORAGATE_ROUTES_REFRESH_S",
        "LORAGATE_BREAKER_ERRORS",
        "LORAGATE_BREAKER_SLOW",
        "LORAGATE_BREAKER_COOLDOWN_S",
        "LORAGATE_FEEDBACK_TTL_S",
    }
)


def split_environment(served_name: str, url: str, knobs: dict[str, str], faults_file: Path | None) -> dict[str, str]:
    """The split's environment variables.

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
        env[FAULTS_VARIABLE] = str(faults_file)
    return env
