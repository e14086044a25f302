"""Settings: where the registry lives and the limits it enforces.

One pydantic-settings model read from ``LORAGATE_*`` variables (and ``HF_HUB_CACHE``) at
the edge -- the CLI, a task's entry point -- and passed in from there; nothing below reads
the environment itself. An invalid value is refused as ``invalid_setting`` naming the
variable. Defaults put everything under ``./.loragate/`` so a fresh checkout works with no
configuration. The database URL is parsed by SQLAlchemy's ``make_url`` here and nowhere
else; it is shown only with its password hidden.
"""

from __future__ import annotations

import getpass
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from loragate.registry.errors import ErrorCode, InvalidInput

GIB = 1 << 30
MIB = 1 << 20
ENV_PREFIX = "LORAGATE_"

# vLLM accepts only these values for --max-lora-rank
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
_BACKENDS = {"sqlite": "sqlite", "postgresql": "postgresql+psycopg", "postgres": "postgresql+psycopg"}


def _default_actor() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no passwd entry inside some containers
        return "unknown"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, frozen=True, extra="ignore", populate_by_name=True)

    home: Path = Path(".loragate")
    # SQLAlchemy URL; defaults to a SQLite file under ``home``
    database_url: str = Field(default="", repr=False)
    # a directory, or s3://bucket/prefix; defaults to ``home``/artifacts
    artifacts: str = ""
    s3_endpoint_url: str | None = None
    # bounded waits on the artifact store and the database: a stalled one is an error, not a hang
    s3_connect_timeout_s: float = Field(default=5.0, gt=0)
    s3_read_timeout_s: float = Field(default=30.0, gt=0)
    s3_max_attempts: int = Field(default=3, ge=1)
    database_connect_timeout_s: int = Field(default=10, ge=1)
    # every registry session (Postgres): a lock waited for (an adapter held by a stuck move;
    # what `loragate rollback` waits at most), one statement, a transaction left idle (longer
    # than any replica switch made under it). 0: no limit
    database_lock_timeout_s: float = Field(default=60.0, ge=0)
    database_statement_timeout_s: float = Field(default=120.0, ge=0)
    database_idle_in_transaction_timeout_s: float = Field(default=300.0, ge=0)
    # bounded waits on a vLLM replica: a hanging one fails the switch, and is put back
    replica_connect_timeout_s: float = Field(default=3.0, gt=0)
    replica_read_timeout_s: float = Field(default=30.0, gt=0)
    # one request to a replica in all, connection to last byte (a replica that drips)
    replica_request_deadline_s: float = Field(default=60.0, gt=0)
    # the file holding the key the replicas' admin API (load, unload) asks for: the fleet
    # control's secret. A worker finds it in its secrets directory instead (replica-admin-key)
    replica_admin_key_file: Path | None = None
    # tries at switching one replica (unload, load, verify) when it is unreachable or
    # answers 5xx, before the whole stage is put back
    replica_switch_attempts: int = Field(default=2, ge=1)
    # share of the golden prompts a replica must answer exactly as shadow validation did
    # after a deploy: 1.0 on the CPU float32 path, lower for other dtypes and kernels
    deploy_agreement: float = Field(default=1.0, ge=0.0, le=1.0)
    # scratch files of a crashed writer older than this are swept by the next write and by gc
    litter_age_s: float = Field(default=3600.0, ge=0)
    # where pinned Hugging Face bases are looked up; None: huggingface_hub's default
    hf_cache_dir: str | None = Field(default=None, validation_alias="HF_HUB_CACHE")
    # the serving fleet's --max-lora-rank; vLLM's own default is 16
    max_lora_rank: int = 16
    max_weights_bytes: int = Field(default=4 * GIB, ge=1)
    max_json_bytes: int = Field(default=1 * MIB, ge=1)
    golden_min_cases: int = Field(default=5, ge=1)
    golden_max_cases: int = Field(default=1000, ge=1)
    # golden pass rate an adapter needs
    validation_threshold: float = Field(default=0.8, ge=0.0, le=1.0)
    # the largest |logit change| an adapter may cause and still count as doing nothing
    noop_tolerance: float = Field(default=1e-4, gt=0.0)
    # torch device shadow validation runs on ("cuda" on a GPU worker)
    validation_device: str = "cpu"
    # how far the candidate's pass rate may fall below production's, overall or on any
    # slice, before the regression check fails; 0: any case production gets right and the
    # candidate gets wrong fails it
    regression_epsilon: float = Field(default=0.0, ge=0.0, le=1.0)
    # adaptersentry's policy: "strict" blocks on structural red flags (full matrices, rank
    # mismatch, code beside the weights), "default" only asks for review
    scan_policy: Literal["strict", "default"] = "strict"
    # block, not just review, a module concentrated on a few outputs past this z
    # (adaptersentry asks for review from 14); None: never block on that pattern alone
    scan_block_z: float | None = Field(default=None, gt=0)
    # -- the canary watch (``canary`` opens a window with these; the window keeps them) --
    # how long a canary must stay in band before it is ready for sign-off
    canary_window_s: float = Field(default=24 * 3600.0, gt=0)
    # the canary's p95 latency may be at most this times production's (plus the slack below:
    # on a shared CPU host a few ms of jitter would otherwise flap the verdict)
    canary_p95_ratio: float = Field(default=1.10, ge=1.0)
    canary_p95_slack_ms: float = Field(default=0.0, ge=0.0)
    # a first canary (the adapter has no production version) is compared with the bare base,
    # which LoRA's own arithmetic makes it slower than on every prompt: its band is this ratio
    canary_first_p95_ratio: float = Field(default=1.5, ge=1.0)
    # share of golden prompts the canary may answer differently from shadow validation
    canary_drift_epsilon: float = Field(default=0.05, ge=0.0, le=1.0)
    # observations in a row with p95 out of band before an auto-rollback (errors and drift
    # roll back at once: they are not noise)
    canary_latency_breaches: int = Field(default=2, ge=1)
    # extra prompts sent to canary and production besides the golden ones: JSONL of
    # {"prompt": ..., "max_tokens": ...}
    canary_probe_set: str | None = None
    # each prompt is sent this many times per observation (latency samples)
    canary_probe_rounds: int = Field(default=2, ge=1)
    # windows ``canary-evaluate`` observes at once: a replica batches concurrent requests, and
    # each window's pairs stay back to back, so both sides see the same concurrency
    canary_observed_at_once: int = Field(default=8, ge=1, le=64)
    # seconds into a ``canary-evaluate`` run after which it starts no further observation: the
    # windows left are the next run's first (least recently observed first). Under the
    # schedule's 600 s interval, so a run never overlaps the next one
    canary_evaluate_budget_s: float = Field(default=480.0, gt=0)
    # -- live traffic through the canary (the split inside each production replica) --
    # the most of an adapter's live requests a canary answers without a person's sign-off:
    # above it only the promotion's own "every user to the canary" step, on a redeemed
    # sign-off. `loragate init` copies it into the database, whose rules hold the roles to it
    canary_max_share: float = Field(default=0.5, ge=0.0, le=1.0)
    # share of an adapter's live requests the canary answers while its window runs
    canary_share: float = Field(default=0.01, ge=0.0, le=1.0)
    # live canary requests a window needs before it may become ready (fewer: it says so)
    canary_min_live_requests: int = Field(default=100, ge=0)
    # confidence of the live tests: worse errors roll back, the A/B bar is met, at this level
    canary_confidence: float = Field(default=0.95, gt=0.5, lt=1.0)
    # the chance that a version failing no more than production is ever rolled back during its
    # window, shared by the rules that can roll back (rules/sequential.py)
    canary_false_rollback: float = Field(default=0.01, gt=0.0, lt=0.5)
    # a window is ready only once its live traffic could catch a canary failing this many times
    # as often as production (at least LORAGATE_CANARY_DETECT_ERROR_RATE) with this power;
    # fewer requests by its end: undecided (docs/live-traffic.md). 0 (or 1): the minimum alone
    canary_detect_ratio: float = Field(default=2.0, ge=0.0)
    canary_power: float = Field(default=0.8, ge=0.5, lt=1.0)
    canary_detect_error_rate: float = Field(default=0.01, gt=0.0, lt=0.5)
    # the most of an adapter's live requests the watch gives a canary on its own to get the
    # requests it needs in time (every step audited); at most LORAGATE_CANARY_MAX_SHARE
    canary_max_auto_share: float = Field(default=0.10, ge=0.0, le=1.0)
    # make the A/B bar a gate: a window is ready only when the canary meets production's
    # figures at the confidence above (non-inferiority within the margin below)
    canary_ab_gate: bool = False
    canary_ab_error_margin: float = Field(default=0.01, ge=0.0, le=1.0)
    # a replica's fallback rate over its last 15 minutes above this alerts
    fallback_alert_rate: float = Field(default=0.05, ge=0.0, le=1.0)
    # the most adapters of a base pinned on its production replicas (a person's pins count, and
    # are kept beyond it): the traffic watch pins the busiest of the last 15 minutes up to it,
    # never more than each production replica's slots leave (rules/pinning.py). 0: no hot pins
    hot_pins: int = Field(default=10, ge=0)
    # a production version older than this is an alert (the seeds' 30 days): retrain or confirm
    version_age_alert_days: float = Field(default=30.0, gt=0)
    # how long a promotion waits for a person's decision, and how often it looks
    approval_timeout_s: float = Field(default=7 * 24 * 3600.0, gt=0)
    # how long an approval code (`loragate approve-code`) stays good: issued, typed, used
    approval_code_ttl_s: float = Field(default=900.0, ge=30, le=24 * 3600)
    approval_poll_s: float = Field(default=2.0, gt=0)
    # the `advance` sweep: a version waiting for a gate this long with no live run for it
    # gets one (its event was lost or its action failed); one waiting this long is reported
    advance_after_s: float = Field(default=120.0, ge=0)
    stuck_alert_s: float = Field(default=3600.0, gt=0)
    # ... and a RUNNING flow run that sent no event (heartbeat, state) for this long lost its
    # process: the sweep crashes it (never sooner than three of its heartbeat intervals)
    unresponsive_after_s: float = Field(default=180.0, gt=0)
    # the Prefect UI a notification links to (approval forms live there)
    ui_url: str = "http://127.0.0.1:4200"
    # Slack: off while the token or the channel is unset; base_url points elsewhere in tests
    slack_token: str | None = Field(default=None, repr=False)
    slack_channel: str | None = None
    slack_base_url: str | None = None
    actor: str = Field(default_factory=_default_actor, min_length=1)
    # the API token every mutating command and flow presents (LORAGATE_TOKEN); never printed
    token: str | None = Field(default=None, repr=False)

    def __init__(self, **values: Any) -> None:
        """Raises:
        InvalidInput: INVALID_SETTING naming the variable of the first invalid value.
        """
        try:
            super().__init__(**values)
        except ValidationError as e:
            raise _setting_error(e) from e

    @model_validator(mode="before")
    @classmethod
    def _defaults_under_home(cls, data: Any) -> Any:
        if isinstance(data, dict):
            home = Path(data.get("home") or ".loragate")
            if not data.get("database_url"):
                data["database_url"] = f"sqlite:///{home / 'registry.db'}"
            if not data.get("artifacts"):
                data["artifacts"] = str(home / "artifacts")
        return data

    @field_validator("max_lora_rank")
    @classmethod
    def _vllm_rank(cls, value: int) -> int:
        if value not in VLLM_LORA_RANKS:
            raise ValueError(f"{value} is not one vLLM accepts {VLLM_LORA_RANKS}")
        return value

    @field_validator("canary_share")
    @classmethod
    def _share_within_cap(cls, value: float, info: ValidationInfo) -> float:
        cap = info.data.get("canary_max_share")  # validated first: declared first
        if cap is not None and value > cap:
            raise ValueError(f"{value:g} is above LORAGATE_CANARY_MAX_SHARE ({cap:g})")
        return value

    @field_validator("database_url")
    @classmethod
    def _database_url(cls, value: str) -> str:
        url = _parse_url(value)
        backend = url.get_backend_name()
        if backend not in _BACKENDS:
            raise ValueError(f"backend {backend!r} is not supported: use sqlite or postgresql")
        if backend == "sqlite" and not url.database:
            raise ValueError("a SQLite URL needs a file path (sqlite:///path/registry.db)")
        return value

    @property
    def database(self) -> URL:
        """The database URL with loragate's driver choices (psycopg 3 for Postgres)."""
        url = _parse_url(self.database_url)
        return url.set(drivername=_BACKENDS[url.get_backend_name()])

    @property
    def database_url_redacted(self) -> str:
        """The URL as it may be printed, logged or stored: password hidden."""
        return self.database.render_as_string(hide_password=True)

    @property
    def sqlite_path(self) -> Path | None:
        url = self.database
        return Path(url.database) if url.get_backend_name() == "sqlite" and url.database else None


def _parse_url(value: str) -> URL:
    try:
        return make_url(value)
    except (ArgumentError, ValueError) as e:
        # the message of make_url quotes the URL, password and all: say only what is wrong
        raise ValueError("is not a database URL (dialect://user:password@host/dbname)") from e


def env_var(field: str) -> str:
    """The environment variable a setting is read from."""
    info = Settings.model_fields.get(field)
    if info is not None and isinstance(info.validation_alias, str):
        return info.validation_alias
    return f"{ENV_PREFIX}{field.upper()}"


def _setting_error(e: ValidationError) -> InvalidInput:
    first = e.errors()[0]
    name = str(first["loc"][0]) if first["loc"] else "settings"
    var = env_var(name) if name in Settings.model_fields else name
    # the input value is not echoed: it may be a URL with a password in it
    message = first["msg"].removeprefix("Value error, ")
    return InvalidInput(message, code=ErrorCode.INVALID_SETTING, field=var)
