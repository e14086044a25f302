"""Replica processes, without vLLM: stopping by PID never signals a process that took a
reused PID, a stop escalates to SIGKILL after its grace period, and ``loragate replicas
up`` failing to start a replica says so in one typed line and leaves nothing behind.

Stand-ins for vLLM: ``sleep``-like Python processes, a shell script that never listens,
and the test venv's own Python, which has no vLLM and exits at once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from loragate.local.processes import ProcessIdentity, Stopped, stop_process_tree
from loragate.local.replica import VllmReplica
from loragate.local.replica_processes import LEGACY_MARKER, recorded_replicas
from loragate.local.replica_secrets import write_replica_secrets
from loragate.registry.errors import ErrorCode, ReplicaError

SLEEPER = "import time; time.sleep(120)"
# a parent that forks a child, then both wait; the parent says when the child is there
PARENT_AND_CHILD = (
    "import subprocess, sys, time; "
    f"c = subprocess.Popen([sys.executable, '-c', {SLEEPER!r}]); "
    "print(c.pid, flush=True); time.sleep(120)"
)
# ignores SIGTERM, and says so once it does
STUBBORN = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('ready', flush=True); time.sleep(120)"
)


def _spawn(code: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True, start_new_session=True
    )


@pytest.fixture
def spawned():
    """Processes a test started; any left over are killed afterwards."""
    started: list[subprocess.Popen] = []

    def spawn(code: str, *args: str) -> subprocess.Popen:
        started.append(_spawn(code, *args))
        return started[-1]

    yield spawn
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait()


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_a_stop_terminates_the_process_and_the_children_it_forked(spawned):
    parent = spawned(PARENT_AND_CHILD)
    child = int(parent.stdout.readline())
    assert stop_process_tree(ProcessIdentity.of(parent.pid), grace_s=10) == Stopped.TERMINATED
    assert parent.wait(timeout=5) is not None
    assert not _alive(child)


def test_a_process_that_ignores_sigterm_is_killed_after_the_grace_period(spawned):
    stubborn = spawned(STUBBORN)
    assert stubborn.stdout.readline().strip() == "ready"
    started = time.monotonic()
    assert stop_process_tree(ProcessIdentity.of(stubborn.pid), grace_s=0.5) == Stopped.KILLED
    assert 0.5 <= time.monotonic() - started < 5
    assert not _alive(stubborn.pid)


def test_a_pid_now_held_by_another_process_is_left_alone(spawned):
    """As when the replica died and the kernel gave its PID to a process started later."""
    other = spawned(SLEEPER)
    recorded = ProcessIdentity(other.pid, psutil.Process(other.pid).create_time() - 3600)
    assert stop_process_tree(recorded, grace_s=0.5) == Stopped.PID_REUSED
    assert other.poll() is None


def test_a_process_that_is_gone_is_not_signalled(spawned):
    gone = spawned("pass")
    identity = ProcessIdentity.of(gone.pid)
    gone.wait()
    assert stop_process_tree(identity) == Stopped.ALREADY_GONE


def test_a_missing_vllm_venv_is_a_typed_replica_error(tmp_path):
    replica = VllmReplica(tmp_path / "model", "tiny-llama", python=tmp_path / "no-venv" / "bin" / "python")
    with pytest.raises(ReplicaError) as err:
        replica.launch()
    assert (err.value.code, err.value.field) == (ErrorCode.REPLICA_UNAVAILABLE, "python")
    assert replica.process is None


def test_a_replica_that_never_answers_is_stopped_and_reported(tmp_path):
    silent = _silent_python(tmp_path)
    replica = VllmReplica(tmp_path / "model", "tiny-llama", python=silent, log_path=tmp_path / "r.log")
    with pytest.raises(ReplicaError) as err:
        replica.start(timeout=0.5)
    assert err.value.code == ErrorCode.REPLICA_UNAVAILABLE and "not ready after 0.5s" in err.value.message
    assert replica.process is not None and replica.process.poll() is not None
    assert not _processes_running(silent)


def test_a_replica_process_inherits_no_credential_of_the_shell_that_starts_it(tmp_path, monkeypatch):
    secrets = {
        "LORAGATE_TOKEN": "lg_secret_token",
        "LORAGATE_DATABASE_URL": "postgresql://admin:hunter2@db/loragate",
        "LORAGATE_SIGNING_KEY": "-----BEGIN PRIVATE KEY-----",
        "AWS_SECRET_ACCESS_KEY": "aws-secret",
        "PREFECT_API_AUTH_STRING": "admin:pass",
        "HF_TOKEN": "hf_secret",  # an allowed prefix does not carry a secret through
    }
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "INFO")
    # the replica's own secrets: the fleet's admin key and the registry's read-only URL, as files
    admin_key, registry_url = "replica-admin-key-value", "postgresql://loragate_replica:pw@db/loragate"
    secrets["(admin key)"], secrets["(registry url)"] = admin_key, registry_url
    replica_secrets = write_replica_secrets(tmp_path / "replica-secrets", admin_key, registry_url)
    replica = VllmReplica(
        tmp_path / "model",
        "tiny-llama",
        python=_silent_python(tmp_path),
        log_path=tmp_path / "r.log",
        adapter_dir=tmp_path / "adapters",
        role="canary",
        secrets_dir=replica_secrets,
    )
    replica.launch()
    try:
        assert replica.process is not None
        child = psutil.Process(replica.process.pid)
        # until it execs, the forked child still shows the test's own environment
        deadline = time.monotonic() + 30
        while str(replica.python) not in " ".join(child.cmdline()) and time.monotonic() < deadline:
            time.sleep(0.05)
        environ = child.environ()
        cmdline = child.cmdline()
    finally:
        replica.stop()
    assert not [arg for arg in cmdline if admin_key in arg or registry_url in arg]
    assert cmdline[cmdline.index("--middleware") + 1] == "loragate_resolver.admin_guard.AdminGuard"
    assert not set(secrets) & set(environ), sorted(set(secrets) & set(environ))
    assert not [name for name, value in environ.items() if value in secrets.values()]
    # what vLLM and the resolver plugin need is there
    assert environ["LORAGATE_ADAPTER_DIR"] == str(tmp_path / "adapters")
    assert environ["LORAGATE_REPLICA_ROLE"] == "canary"
    assert environ["LORAGATE_REPLICA_SECRETS_DIR"] == str(replica_secrets)  # where, never what
    assert environ["VLLM_LOGGING_LEVEL"] == "INFO" and environ["PATH"] == os.environ["PATH"]


def _silent_python(tmp_path: Path) -> Path:
    """A "python" that takes vLLM's arguments, never listens, and has a child of its own."""
    script = tmp_path / "silent-python"
    script.write_text("#!/bin/sh\nsleep 120 &\nwait\n")
    script.chmod(0o755)
    return script


def _processes_running(path: Path) -> list[int]:
    running = []
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        if str(path) in (p.info["cmdline"] or []) and p.info["status"] != psutil.STATUS_ZOMBIE:
            running.append(p.info["pid"])
    return running


# -- the command --------------------------------------------------------------------------


def _one_error_line(result: subprocess.CompletedProcess, code: str, field: str) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {code} [{field}]: "), result.stderr
    return lines[0]


def test_replicas_up_that_cannot_start_vllm_exits_1_in_one_line_and_leaves_nothing(catalogued_cli, tmp_path):
    # the test venv's Python has no vLLM: the replica exits at once
    up = catalogued_cli("replicas", "up", "--base", "tiny-llama", "--vllm-python", sys.executable, "--count", "2")
    assert up.returncode == 1
    line = _one_error_line(up, "replica_unavailable", "url")
    assert "exited with 1 before answering" in line
    log = Path(line.rsplit("log: ", 1)[1])
    assert "No module named 'vllm'" in log.read_text()
    assert json.loads(catalogued_cli("fleet", "list", "--json").stdout) == []
    assert not list((tmp_path / "home" / "replicas").glob("*.json"))


def test_replicas_up_whose_replica_never_answers_stops_it_and_exits_1(catalogued_cli, tmp_path):
    silent = _silent_python(tmp_path)
    up = catalogued_cli(
        "replicas", "up", "--base", "tiny-llama", "--vllm-python", str(silent), "--start-timeout", "0.5"
    )
    assert up.returncode == 1
    assert "not ready after 0.5s" in _one_error_line(up, "replica_unavailable", "url")
    assert not _processes_running(silent)
    assert not list((tmp_path / "home" / "replicas").glob("*.json"))


def test_replicas_up_with_a_vllm_python_that_is_not_there_is_bad_input(catalogued_cli, tmp_path):
    up = catalogued_cli("replicas", "up", "--base", "tiny-llama", "--vllm-python", str(tmp_path / "nope"))
    assert up.returncode == 2
    _one_error_line(up, "invalid_setting", "vllm_python")


def _write_record(state_dir: Path, port: int, pid: int, create_time: float | None) -> None:
    state = {"url": f"http://127.0.0.1:{port}", "pid": pid, "log": str(state_dir / f"{port}.log"), "base": "tiny-llama"}
    if create_time is not None:
        state["create_time"] = create_time
    state_dir.mkdir(parents=True, exist_ok=True)
    (state_dir / f"{port}.json").write_text(json.dumps(state))


def test_replicas_down_stops_only_the_processes_it_started(catalogued_cli, tmp_path, spawned):
    state_dir = tmp_path / "home" / "replicas"
    ours = spawned(SLEEPER)
    _write_record(state_dir, 18001, ours.pid, psutil.Process(ours.pid).create_time())
    stranger = spawned(SLEEPER)  # took the PID of a replica that died
    _write_record(state_dir, 18002, stranger.pid, psutil.Process(stranger.pid).create_time() - 3600)
    # a record from before creation times were kept: the command line must name vLLM and the port
    legacy = spawned(SLEEPER, LEGACY_MARKER, "--port", "18003")
    _write_record(state_dir, 18003, legacy.pid, None)
    legacy_stranger = spawned(SLEEPER)
    _write_record(state_dir, 18004, legacy_stranger.pid, None)
    _write_record(state_dir, 18005, 2**22 + 7, 1.0)  # gone long ago (above Linux's PID limit)
    assert len(recorded_replicas(state_dir)) == 5

    down = catalogued_cli("replicas", "down", "--json")
    assert down.returncode == 0, down.stderr
    outcomes = json.loads(down.stdout)["outcomes"]
    assert outcomes == {
        "http://127.0.0.1:18001": "terminated",
        "http://127.0.0.1:18002": Stopped.PID_REUSED.value,
        "http://127.0.0.1:18003": "terminated",
        "http://127.0.0.1:18004": Stopped.PID_REUSED.value,
        "http://127.0.0.1:18005": "already gone",
    }
    assert ours.wait(timeout=5) is not None and legacy.wait(timeout=5) is not None
    assert stranger.poll() is None and legacy_stranger.poll() is None
    assert recorded_replicas(state_dir) == []
    assert os.path.isdir(state_dir)
