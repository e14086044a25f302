"""What a local replica is started with, without starting one: the command line and the
environment ``ReplicaConfig`` gives vLLM and the resolver plugin (``loragate/local/replica_config.py``).
The process itself: tests/test_replica_processes.py; real replicas: tests/test_serving.py and the
fleet tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from loragate.local.replica_config import ADMIN_GUARD, ReplicaConfig, default_max_cpu_loras
from loragate.local.replica_split import TRAFFIC_SPLIT
from loragate.registry.errors import ErrorCode, InvalidInput

PARENT = {"PATH": "/usr/bin", "HOME": "/root", "HF_TOKEN": "hf_x", "LORAGATE_DATABASE_URL": "postgresql://u:p@h/db"}


def middleware(config: ReplicaConfig) -> list[str]:
    cmd = config.command()
    return [cmd[i + 1] for i, a in enumerate(cmd) if a == "--middleware"]


def test_a_bare_replica_runs_no_middleware_and_is_told_no_secrets(tmp_path):
    config = ReplicaConfig(tmp_path / "model", "tiny-llama", port=8123)
    cmd = config.command()
    assert cmd[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert cmd[cmd.index("--max-cpu-loras") + 1] == str(default_max_cpu_loras(4)) == "16"
    assert middleware(config) == []
    env = config.environment(PARENT)
    assert "LORAGATE_REPLICA_SECRETS_DIR" not in env and "LORAGATE_ADAPTER_DIR" not in env
    assert env["LORAGATE_REPLICA_URL"] == "http://127.0.0.1:8123"


def test_a_replica_with_secrets_guards_its_admin_api_then_runs_the_split(tmp_path):
    config = ReplicaConfig(tmp_path / "model", "tiny-llama", adapter_dir=tmp_path / "a", secrets_dir=tmp_path / "s")
    assert middleware(config) == [ADMIN_GUARD, TRAFFIC_SPLIT]
    env = config.environment(PARENT)
    assert env["LORAGATE_REPLICA_SECRETS_DIR"] == str(tmp_path / "s")
    assert env["LORAGATE_ADAPTER_DIR"] == str(tmp_path / "a") and env["LORAGATE_REPLICA_ROLE"] == "production"
    assert middleware(ReplicaConfig(tmp_path, "m", secrets_dir=tmp_path, traffic_split=False)) == [ADMIN_GUARD]


def test_the_environment_holds_nothing_of_the_parents_credentials(tmp_path):
    env = ReplicaConfig(tmp_path / "model", "tiny-llama", owner_moves=True).environment(PARENT)
    assert env["PATH"] == "/usr/bin" and env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "1"
    assert env["LORAGATE_OWNER_MOVES"] == "1"
    assert "HF_TOKEN" not in env and "LORAGATE_DATABASE_URL" not in env


def test_a_knob_the_split_does_not_read_is_refused(tmp_path):
    config = ReplicaConfig(Path(tmp_path), "tiny-llama", traffic_env={"LORAGATE_NO_SUCH_KNOB": "1"})
    with pytest.raises(InvalidInput) as refused:
        config.environment(PARENT)
    assert refused.value.code == ErrorCode.INVALID_SETTING
