"""Server settings: environment variables (prefix ``DDPO_``), one place."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import AliasChoices, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from api.route_table import Role
from ddpo import store
from ddpo.schemas.spec import MAX_STOP_GRACE_S


class ServerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="DDPO_", extra="ignore", populate_by_name=True)

    host: str = Field("127.0.0.1", description="Address to bind (loopback by default)")
    port: int = Field(8000, ge=0, le=65535)
    database_url: str = Field(
        "sqlite:///./ddpo.db",
        validation_alias=AliasChoices("DATABASE_URL", "DDPO_DATABASE_URL"),
        description="SQLAlchemy URL; a SQLite file in the working directory by default",
    )
    heartbeat_timeout_s: float = Field(
        6.0,
        gt=0,
        description="A node silent this long is marked lost (workers poll at least every "
        "DDPO_POLL_WAIT_S, 2 s by default)",
    )
    poll_wait_s: float = Field(
        2.0, ge=0, description="Longest a worker's poll is held open waiting for news"
    )
    max_queued_jobs_per_person: int = Field(
        1000,
        ge=1,
        description="Queued jobs one key or role token may have at once (a study counts "
        "its rows); beyond, a submit is a 429",
    )
    start_timeout_s: float = Field(
        900.0,
        gt=0,
        description="A part its node has not reported started this long after it was "
        "assigned fails with launch_failed, and its job retries (the node may be fetching "
        "a large checkpoint: a generous bound)",
    )
    sweep_interval_s: float = Field(1.0, gt=0, description="How often lost nodes are looked for")
    max_page_size: int = Field(500, ge=1)
    max_nodes: int = Field(
        1000, ge=1, description="Nodes this server holds (revoked ones do not count)"
    )
    registrations_per_minute: int = Field(
        120, ge=1, description="New nodes that may join in any minute (429 beyond)"
    )
    retry_backoff_s: float = Field(
        1.0, ge=0, description="Wait before a job's first restart; doubles with each one"
    )
    retry_backoff_max_s: float = Field(60.0, ge=0, description="Longest wait between attempts")
    preemption: bool = Field(
        True,
        description="A queued job that cannot start may stop running jobs of a strictly "
        "lower priority (at a step, with a checkpoint; they requeue at their place)",
    )
    preemption_min_run_s: float = Field(
        60.0,
        ge=0,
        description="A job's attempt is never preempted before it has run this long (against "
        "thrashing: a job stopped as soon as it started has only paid to start)",
    )
    resize_interval_s: float = Field(
        120.0,
        ge=0,
        description="An elastic job grows onto free nodes at most once in this long (each "
        "resize stops it at a step and starts it again on more machines: growing at every "
        "free node would cost more than it buys)",
    )
    stop_grace_s: float = Field(
        120.0,
        ge=0,
        le=MAX_STOP_GRACE_S,
        description="How long a job asked to stop (preempted, drained) has to reach a step "
        "and checkpoint before its ranks are stopped by signal; a job's spec.stop_grace_s "
        "overrides it",
    )
    artifacts_dir: Path = Field(Path("./artifacts"), description="Uploaded checkpoints")
    artifact_store: str | None = Field(
        None,
        description="Keep checkpoints in this store instead of artifacts_dir: file:///path "
        "(a directory every server mounts) or s3://bucket/prefix (endpoint, region and "
        "credentials from AWS_ENDPOINT_URL, AWS_DEFAULT_REGION, AWS_ACCESS_KEY_ID, ...; "
        "needs ddpo's s3 extra). Any server then serves any job's model",
    )
    tensorboard_dir: Path | None = Field(
        None,
        description="Write rank 0's reports as TensorBoard event files here, a folder per "
        "job (tensorboard --logdir DIR shows every job); needs ddpo's tensorboard extra",
    )
    mlflow_tracking_uri: str | None = Field(
        None,
        description="An MLflow tracking server: a run per job (the spec as params, rank 0's "
        "reports and the result as metrics, the final model as an artifact), its id in the "
        "ranks' MLFLOW_RUN_ID; needs ddpo's mlflow extra on the servers",
    )
    mlflow_experiment: str = Field(
        "ddpo", min_length=1, description="The MLflow experiment the runs go in"
    )
    max_checkpoint_mb: int = Field(2048, ge=1, description="Largest checkpoint accepted")
    artifacts_quota_mb: int = Field(
        20480,
        ge=1,
        description="Disk the checkpoints kept and arriving may use together (507 beyond)",
    )
    log_retention_days: float = Field(
        30.0,
        gt=0,
        description="Log lines and progress rows of a job that ended longer ago are deleted "
        "(the job, its result and its timing stay)",
    )
    max_log_lines_per_job: int = Field(
        200_000,
        ge=1,
        description="A job keeps its newest this many log lines (older ones are dropped as "
        "new ones arrive)",
    )
    log_lines_per_second_per_node: float = Field(
        1000.0,
        gt=0,
        description="Log lines a node may send a second on average (a batch of up to 10,000 "
        "at once); beyond, 429 with Retry-After, and the worker sends them later",
    )
    checkpoint_retention_days: float = Field(
        7.0, gt=0, description="The final model of a job that ended longer ago is deleted"
    )
    max_kept_checkpoints: int = Field(
        50, ge=0, description="Ended jobs that keep their final model: the most recent ones"
    )
    idempotency_key_hours: float = Field(
        24.0,
        gt=0,
        description="An Idempotency-Key returns its job for this long; later, it makes a new one",
    )
    retention_interval_s: float = Field(60.0, gt=0, description="How often old data is pruned")
    max_body_kb: int = Field(
        16384,
        ge=1,
        description="Largest request body (checkpoints excepted): a worker's biggest batch "
        "of log lines is about 8 MiB",
    )
    body_decoders: int = Field(
        2,
        ge=1,
        le=64,
        description="Processes that decode a node's bodies over 256 KiB (started with the "
        "first one), so that a large body never holds up other requests",
    )
    max_small_body_kb: int = Field(
        1024,
        ge=1,
        description="Largest body of a request that never needs a large one (a submit, a "
        "poll, a finish); a node's log and progress batches and its registration may use "
        "DDPO_MAX_BODY_KB",
    )
    allowed_hosts: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Names (comma-separated) requests may carry in their Host header; "
        "none: the bound address and localhost, or any name when binding 0.0.0.0; * any",
    )
    trusted_proxies: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Addresses (comma-separated) of reverse proxies whose X-Forwarded-For "
        "names the client (in the audit log); none by default: the connection's peer, "
        "whatever a request's headers claim",
    )
    cors_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Origins whose pages may call the API from a browser, comma-separated "
        "(none by default: only the server's own dashboard)",
    )
    max_connections: int = Field(
        2048,
        ge=16,
        description="Connections and requests served at once (503 beyond); a worker holds "
        "two (its polls and its heartbeats)",
    )
    header_timeout_s: float = Field(
        10.0, gt=0, description="A request's head must arrive within this (then: closed)"
    )
    send_timeout_s: float = Field(
        30.0, gt=0, description="A reader that takes none of its answer this long is cut off"
    )
    body_timeout_s: float = Field(
        30.0, gt=0, description="A request body that stops arriving this long is cut off"
    )
    min_body_bytes_per_s: int = Field(
        1024,
        ge=1,
        description="A body still arriving after DDPO_BODY_TIMEOUT_S more slowly than this "
        "on average is cut off (a byte every few seconds would hold its connection for hours)",
    )
    max_header_kb: int = Field(
        64, ge=1, le=1024, description="Largest request head (line and headers); 431 beyond"
    )
    connections_per_address: int = Field(
        512,
        ge=1,
        description="Connections one client address may hold at once (503 beyond), so one "
        "host cannot take them all; several servers' workers behind one NAT share it",
    )
    keep_alive_s: float = Field(
        5.0, gt=0, description="An idle keep-alive connection is closed after this"
    )
    log_level: str = "info"
    nice: int = Field(
        0,
        ge=0,
        le=19,
        description="Lower the server's CPU priority by this much (ddpo local-cluster uses "
        "10: on a host that also trains, the orchestrator yields the cores to the training)",
    )
    access_log: bool = Field(
        False,
        description="Log every request (off by default: at dashboard polling rates the "
        "log lines cost the server more CPU than answering; /metrics has request latency)",
    )

    admin_token: SecretStr | None = Field(
        None, description="Bearer token of the admin role (everything people can do)"
    )
    user_token: SecretStr | None = Field(
        None, description="Bearer token for people and scripts: submit, cancel, read"
    )
    read_token: SecretStr | None = Field(None, description="Bearer token for dashboards: read only")
    join_token: SecretStr | None = Field(
        None,
        description="Bearer token a machine presents to join as a new node (registration "
        "only: each node then gets a credential of its own)",
    )

    no_auth: bool = Field(
        False,
        description="Serve without tokens: anyone who reaches the server may do anything. "
        "Loopback only, and never the default (with no tokens set, the server makes them)",
    )
    token_file: Path | None = Field(
        None,
        description="Where a server started without tokens keeps the ones it makes "
        "(default: beside a SQLite database, ddpo.db -> ddpo-tokens.env)",
    )

    @property
    def role_tokens(self) -> dict[Role, SecretStr | None]:
        return {
            Role.ADMIN: self.admin_token,
            Role.USER: self.user_token,
            Role.READER: self.read_token,
            Role.JOIN: self.join_token,
        }

    @property
    def tokens_configured(self) -> bool:
        return any(t is not None and t.get_secret_value() for t in self.role_tokens.values())

    @field_validator("artifact_store")
    @classmethod
    def _a_store_we_can_use(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        try:
            return store.check(value.strip())
        except store.StoreError as exc:
            raise ValueError(str(exc)) from exc

    @field_validator("cors_origins", "allowed_hosts", "trusted_proxies", mode="before")
    @classmethod
    def _split_origins(cls, value: object) -> object:
        if isinstance(value, str):
            return [origin.strip() for origin in value.split(",") if origin.strip()]
        return value

    @property
    def heartbeat_interval_s(self) -> float:
        """How often a worker's heartbeat thread reports: three chances to be
        heard within the timeout."""
        return self.heartbeat_timeout_s / 3

    @model_validator(mode="after")
    def _check(self) -> ServerSettings:
        if self.poll_wait_s >= self.heartbeat_timeout_s:
            raise ValueError("DDPO_POLL_WAIT_S must be shorter than DDPO_HEARTBEAT_TIMEOUT_S")
        _check_tokens(self.role_tokens)
        if self.no_auth and self.tokens_configured:
            raise ValueError(
                "DDPO_NO_AUTH is set, and so are tokens: choose one (unset DDPO_NO_AUTH to "
                "check the tokens)"
            )
        return self


# 128 bits as URL-safe base64 (secrets.token_urlsafe(16)): a token anyone
# could guess or try is no boundary.
MIN_TOKEN_CHARS = 22
TOKEN_VARIABLES = {
    Role.ADMIN: "DDPO_ADMIN_TOKEN",
    Role.USER: "DDPO_USER_TOKEN",
    Role.READER: "DDPO_READ_TOKEN",
    Role.JOIN: "DDPO_JOIN_TOKEN",
}


def _check_tokens(tokens: dict[Role, SecretStr | None]) -> None:
    """Refuse a token too short to be secret, and one token for two roles
    (the server could not tell which role its holder has)."""
    seen: dict[str, Role] = {}
    for role, token in tokens.items():
        value = token.get_secret_value() if token is not None else ""
        if not value:
            continue
        name = TOKEN_VARIABLES[role]
        if len(value) < MIN_TOKEN_CHARS:
            raise ValueError(
                f"{name} is {len(value)} characters long: a token needs at least "
                f"{MIN_TOKEN_CHARS} random ones (128 bits); make one with python -c "
                "'import secrets; print(secrets.token_urlsafe(32))'"
            )
        if value in seen:
            raise ValueError(
                f"{TOKEN_VARIABLES[seen[value]]} and {name} are the same token: "
                "each role needs a token of its own"
            )
        seen[value] = role
