"""A real local Prefect server and process workers, for tests and ``make demo``.

``start_prefect_server`` runs ``prefect server start`` (API, UI and all its services, the
scheduler included: schedules create runs only there, never in ephemeral mode) on
127.0.0.1 with its SQLite database and log under a directory of the caller's, in a process
group of its own so that ``stop`` ends it and whatever it spawned. ``start_worker`` runs a
process worker (or a warm one) against it. Every poll and service loop that sits between
"something happened" and "a flow runs" is lowered from Prefect's production defaults
(10-60 s) to 1-2 s, so a pipeline reacts within seconds here. Importing this module does not import
Prefect (it costs ~2 s); the processes do.

The server runs with API authentication on (``PREFECT_SERVER_API_AUTH_STRING``, HTTP basic
auth): a credential of its own, generated at its first start and kept beside its database
(``api-auth``, 0600), so nothing that can merely reach the port -- the UI, the API, the
events endpoint -- gets past the login. Workers, the ``prefect`` and ``loragate`` CLIs and
the tests carry it as ``PREFECT_API_AUTH_STRING`` (``PrefectServer.env``); a browser types it
into the UI's login form.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

# what a worker, a `serve` runner and the flow runs they start read (Prefect 3.8 names)
FAST_POLL_ENV: dict[str, str] = {
    # how often a worker asks its pool for runs to start (default 10 s)
    "PREFECT_WORKER_QUERY_SECONDS": "1",
    # how far ahead of their scheduled time a worker picks runs up (default 10 s)
    "PREFECT_WORKER_PREFETCH_SECONDS": "2",
    # how often `flow.serve()` / a runner polls for runs (default 10 s)
    "PREFECT_RUNNER_POLL_FREQUENCY": "1",
}

# flow runs one process worker runs at once: each is a Python process (~150 MB, ~2 s of
# imports); 50 started together on two cores took minutes to import and swamped the server
# (bench/scale.py). The rest wait in Prefect, scheduled, and start as runs end; a run
# suspended for a sign-off has ended
WORKER_LIMIT = 4
# the package a warm worker runs flows of: a deployment naming other code crashes unrun
FLOWS_PACKAGE = "loragate.flows"

# Prefect's shortest heartbeat interval (its default is 180 s): what the pipeline's workers
# set for their flow runs, so that the advance sweep can tell a run whose process is gone
# from a busy one within minutes (tasks/unresponsive.py)
HEARTBEAT_S = 30
HEARTBEAT_ENV = {"PREFECT_FLOWS_HEARTBEAT_FREQUENCY": str(HEARTBEAT_S)}

# what the server's own services read (Prefect 3.8 names)
SERVER_LOOP_ENV: dict[str, str] = {
    # the scheduler creates runs for scheduled deployments (default every 60 s) ...
    "PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": "2",
    # ... and for deployments created or changed just now (default 5 s)
    "PREFECT_SERVER_SERVICES_SCHEDULER_RECENT_DEPLOYMENTS_LOOP_SECONDS": "1",
    # a paused run whose timeout passed is failed by this loop (default 5 s)
    "PREFECT_SERVER_SERVICES_PAUSE_EXPIRATIONS_LOOP_SECONDS": "1",
    # marks runs Late (default 5 s); cosmetic, but keeps the UI truthful in short tests
    "PREFECT_SERVER_SERVICES_LATE_RUNS_LOOP_SECONDS": "2",
    # proactive triggers ("expect X within N s") are evaluated at this granularity
    # (default 5 s); reactive event triggers fire on arrival and need no tuning
    "PREFECT_SERVER_EVENTS_PROACTIVE_GRANULARITY": "PT1S",  # a timedelta: ISO 8601
}

HEALTH_DEADLINE_S = 90.0
AUTH_FILE = "api-auth"


def prefect_bin() -> str:
    """The ``prefect`` console script of the running interpreter's environment."""
    return str(Path(sys.executable).parent / "prefect")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class PrefectServer:
    api_url: str  # http://127.0.0.1:PORT/api
    ui_url: str  # http://127.0.0.1:PORT
    home: Path  # PREFECT_HOME of the server (SQLite database, UI build, server.log)
    env: dict[str, str] = field(repr=False)  # what a worker or the `prefect` CLI needs to talk to it
    process: subprocess.Popen = field(repr=False)
    auth_string: str = field(default="", repr=False)  # "user:password" of the API's basic auth
    on_postgres: bool = False  # its database: Postgres, or the SQLite default

    @property
    def log(self) -> Path:
        return self.home / "server.log"

    def auth_headers(self) -> dict[str, str]:
        """For a plain HTTP client (``httpx``) calling the API."""
        return {"Authorization": "Basic " + base64.b64encode(self.auth_string.encode()).decode()}

    def client_settings(self) -> dict:
        """For ``prefect.settings.temporary_settings``: Prefect clients in this process
        talk to this server, with its credential."""
        from prefect.settings import PREFECT_API_AUTH_STRING, PREFECT_API_URL

        return {PREFECT_API_URL: self.api_url, PREFECT_API_AUTH_STRING: self.auth_string}


def server_auth_string(home: Path) -> str:
    """The server's API credential: the one kept under ``home``, or a new one (kept there,
    readable by its owner only, before any server uses it)."""
    path = Path(home) / AUTH_FILE
    try:
        found = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        found = ""
    if found:
        return found
    made = f"loragate:{secrets.token_urlsafe(24)}"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(made + "\n")
    return made


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def start_prefect_server(
    home: Path, port: int | None = None, *, deadline_s: float = HEALTH_DEADLINE_S, database_url: str | None = None
) -> PrefectServer:
    """Start ``prefect server start`` on 127.0.0.1 with PREFECT_HOME=home; return once healthy.

    Its database is SQLite under ``home`` unless ``database_url`` names another
    (``postgresql+asyncpg://...``: what production uses, and what stays responsive when
    several workers and a browser write at once -- SQLite answers 503 "database is locked").

    Raises RuntimeError, with the tail of the server's log, when it exits or is not
    healthy within ``deadline_s`` (then it is stopped first).
    """
    home = Path(home).resolve()
    home.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    ui_url = f"http://127.0.0.1:{port}"
    api_url = f"{ui_url}/api"
    auth_string = server_auth_string(home)
    client_env = {
        "PREFECT_API_URL": api_url,
        "PREFECT_API_AUTH_STRING": auth_string,
        "PREFECT_HOME": str(home),
        **FAST_POLL_ENV,
    }
    server_env = {
        **os.environ,
        "PREFECT_HOME": str(home),
        "PREFECT_SERVER_API_AUTH_STRING": auth_string,
        # the server's own clients (its services) authenticate like everyone else
        "PREFECT_API_AUTH_STRING": auth_string,
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_UI_ENABLED": "true",
        # the UI asks this URL for the API; by default it is built from
        # PREFECT_SERVER_API_PORT (4200), not from --port
        "PREFECT_SERVER_UI_API_URL": api_url,
        **SERVER_LOOP_ENV,
    }
    if database_url:
        server_env["PREFECT_API_DATABASE_CONNECTION_URL"] = database_url
    # a PREFECT_API_URL inherited from the caller would point the server's own clients elsewhere
    server_env.pop("PREFECT_API_URL", None)
    log = home / "server.log"
    with log.open("ab") as out:
        process = subprocess.Popen(
            [prefect_bin(), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
            env=server_env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = PrefectServer(
        api_url=api_url,
        ui_url=ui_url,
        home=home,
        env=client_env,
        process=process,
        auth_string=auth_string,
        on_postgres=database_url is not None,
    )
    end = time.monotonic() + deadline_s
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"prefect server exited with {process.returncode}; {log}:\n{_tail(log)}")
        try:
            if httpx.get(f"{api_url}/health", timeout=5).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        if time.monotonic() > end:
            stop(server)
            raise RuntimeError(
                f"prefect server not healthy at {api_url} after {deadline_s:.0f} s; {log}:\n{_tail(log)}"
            )
        time.sleep(0.5)


def stop_process(process: subprocess.Popen, grace_s: float = 5.0) -> None:
    """SIGTERM the process group ``process`` leads, SIGKILL it after ``grace_s``."""
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=grace_s)


def stop(server: PrefectServer) -> None:
    stop_process(server.process)


def start_worker(
    server: PrefectServer,
    pool: str,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    log: Path | None = None,
    *,
    name: str | None = None,
    limit: int = WORKER_LIMIT,
    warm: bool = False,
    flows_package: str = FLOWS_PACKAGE,
    preload: tuple[str, ...] = (),
    inherit: bool = True,
) -> subprocess.Popen:
    """A ``prefect worker start --type process`` on ``pool`` (created if missing), polling
    every second, running at most ``limit`` flow runs at once, in its own process group;
    ``env`` is merged over the server's client env. ``warm``: a ``WarmWorker`` instead
    (``local/warm_worker.py``), whose runs are threads of its own process, running flows of
    ``flows_package`` only, with the ``preload`` modules imported at its start.
    ``inherit=False``: ``env`` and the server's client env are all it gets, nothing of this
    process's environment (the pipeline's workers: ``local/pipeline.worker_environment``).
    Stop it with ``stop_process``."""
    if warm:
        cmd = [sys.executable, "-m", "loragate.local.warm_worker", "--pool", pool, "--limit", str(limit)]
        cmd += ["--flows-package", flows_package, *(f"--preload={module}" for module in preload)]
    else:
        cmd = [prefect_bin(), "worker", "start", "--pool", pool, "--type", "process", "--limit", str(limit)]
    if name:
        cmd += ["--name", name]
    full_env = {**(os.environ if inherit else {}), **server.env, **(env or {})}
    # a worker acts with its pool's secrets directory, never with the caller's own token
    full_env.pop("LORAGATE_TOKEN", None)
    log = log or server.home / f"worker-{pool}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        return subprocess.Popen(
            cmd,
            env=full_env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


# the machine's Postgres (``make postgres`` starts it); the local stack's Prefect server keeps
# its state there when it answers, SQLite under its home otherwise
LOCAL_POSTGRES = os.environ.get("LORAGATE_LOCAL_POSTGRES", "postgresql://postgres@127.0.0.1:5432/postgres")
# the Prefect server's own database, kept in its home for ``make ui``: no secrets directory's
PREFECT_DATABASE_URL_FILE = "database-url"


def fresh_local_database(home: Path, name: str) -> str | None:
    """A new empty database ``name`` on the local Postgres for a Prefect server whose home is
    ``home`` (its URL kept in ``home/database-url`` for ``make ui``), or None -- SQLite, then
    -- when no Postgres answers within 3 s. A SQLite Prefect server locks under a pipeline's
    workers on two busy cores ("database is locked", runs that never start); Postgres does not."""
    import psycopg
    from psycopg import sql

    try:
        with psycopg.connect(LOCAL_POSTGRES, connect_timeout=3, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    except psycopg.Error:
        return None
    server, _, _ = LOCAL_POSTGRES.rpartition("/")
    url = f"{server.replace('postgresql://', 'postgresql+asyncpg://', 1)}/{name}"
    home.mkdir(parents=True, exist_ok=True)
    (home / PREFECT_DATABASE_URL_FILE).write_text(url)
    return url


def start_local_prefect_server(home: Path, port: int | None = None, *, database: str | None = None) -> PrefectServer:
    """The local stack's Prefect server (``make demo``, ``start_pipeline`` when handed none):
    its state on a fresh database of the local Postgres -- ``database``, else one named after
    ``home`` -- and on SQLite under ``home`` only where no Postgres answers (``make demo`` and
    ``make test`` start the machine's own first, ``make postgres``)."""
    home = Path(home).resolve()
    name = database or f"loragate_prefect_{hashlib.sha256(str(home).encode()).hexdigest()[:12]}"
    return start_prefect_server(home, port, database_url=fresh_local_database(home, name))


def kept_database_url(home: Path) -> str | None:
    """The database a Prefect server whose home is ``home`` used (``fresh_local_database``)."""
    path = home / PREFECT_DATABASE_URL_FILE
    return path.read_text().strip() if path.exists() else None
