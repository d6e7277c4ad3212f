"""server.yaml: a control plane's configuration, grouped by concern."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator

from llmgw.configfiles import ConfigFile, Section, read_yaml, save, validate
from llmgw.core.fallbacks import FallbackSettings
from llmgw.core.flowqueue import FlowSettings
from llmgw.gateway.routing import RoutingSettings
from llmgw.mirror.releases import ReleaseSettings
from llmgw.observability.tracing import TracingSettings


class StoreSettings(Section):
    url: str = ""
    """SQLAlchemy URL of the store; empty: SQLite at ``<data_dir>/llmgw.db``."""
    timeout_s: float = 5.0
    """Every store call gives up after this long, so no request hangs on the store."""
    secrets_key: str = "store-secrets.key"
    """The key the store's secrets (the engines' keys) are sealed with, made at the first start
    (0600; relative paths are under the config's directory). Every control plane of a cluster holds
    the same, as they hold the same CA: ``llmgw server add`` copies it (docs/security.md)."""


class HttpSettings(Section):
    host: str = "127.0.0.1"
    """Address the gateway (/v1), admin API (/api) and /metrics listen on."""
    port: int = Field(default=8080, ge=0, le=65535)
    header_timeout_s: float = Field(default=10.0, gt=0)
    """A connection whose request head (request line and headers) has not arrived whole this long
    after the connection opened, or after the head's first byte, is closed."""
    body_min_bytes_per_s: int = Field(default=1024, ge=0)
    """A request body must keep coming at this rate at least, measured over each window of
    ``body_window_s`` after the first (a grace); slower, the connection is closed (408 when nothing
    was answered yet). Windows while the server holds the body back (its app reads it slowly, or a
    request ahead on the connection is still answered) do not count. 0: no rate is asked."""
    body_window_s: float = Field(default=5.0, gt=0)
    """The window a body's rate is measured over."""
    body_timeout_s: float = Field(default=60.0, gt=0)
    """A request body must arrive whole within this long, plus one second for each MiB received:
    a body sent at 1 MiB/s (8 Mbit/s) or faster is never cut, whatever its size (a /v1/files
    upload of hundreds of MiB), while a slow one, above ``body_min_bytes_per_s``, cannot hold its
    connection for long. Time while the server holds the body back does not count."""
    keep_alive_s: float = Field(default=75.0, gt=0)
    """An idle keep-alive connection (no request under way) is closed after this long."""
    max_connections: int = Field(default=4096, ge=1)
    """Most HTTP connections held open at once. Past it, a new connection takes the place of the
    one idle longest (waiting for its request head, or kept alive between requests); when every
    connection has a request under way, the new one is answered 503 and closed. Descriptors stay
    bounded: the process raises its soft descriptor limit (``ulimit -n``) to leave room for it."""
    api_body_max_bytes: int = Field(default=8 << 20, ge=1024)
    """Largest request body ``/api`` accepts (413 past it); uploads into the mirror
    (``POST /api/mirror/blobs``) have their own limit and ``/v1`` its own (32 MiB)."""
    metrics_address: str = ""
    """``host:port`` where ``/metrics`` is served without a token, for a Prometheus on a trusted
    network; the HTTP port then answers ``/metrics`` 404. Empty: ``/metrics`` is on the HTTP port,
    for the admin token or a viewer at the cluster (docs/metrics.md)."""

    @field_validator("metrics_address")
    @classmethod
    def _host_and_port(cls, value: str) -> str:
        if value:
            host, _, port = value.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) <= 65535:
                raise ValueError(f"{value!r} is not host:port (e.g. 10.0.0.5:9108, or '' for none)")
        return value

    def metrics_host_port(self) -> tuple[str, int]:
        """The host and port of :attr:`metrics_address` (set)."""
        host, _, port = self.metrics_address.rpartition(":")
        return host.strip("[]"), int(port)


class AgentServerSettings(Section):
    host: str = "127.0.0.1"
    """Address agents connect to (gRPC, mutual TLS)."""
    port: int = Field(default=8443, ge=0, le=65535)


class TlsSettings(Section):
    ca: str = "ca.crt"
    """The cluster CA's certificate (relative paths are under the config's directory)."""
    ca_key: str = "ca.key"
    """The CA's key: kept on control planes, used to issue node certificates."""
    cert: str = "server.crt"
    key: str = "server.key"


class ReconcileSettings(Section):
    interval_s: float = 2.0
    """Seconds between reconcile passes (a change also triggers one at once)."""
    restart_backoff_s: float = 2.0
    """First delay before a failed replica is started again; doubles up to ``restart_backoff_max_s``."""
    restart_backoff_max_s: float = 60.0
    node_grace_s: float = Field(default=15.0, ge=0)
    """Seconds a node may be away (agent restarting) with its ready replicas still routed; past them
    its replicas are placed on other nodes and, should it come back, its engines for them stopped."""


class TrainingSettings(Section):
    node_grace_s: float = Field(default=300.0, ge=0)
    """Seconds a node may be away while it runs a training job (a job takes minutes to hours; an agent
    restarting should not lose it); past them the job fails, or is queued again while its --retry lasts."""


class LeadershipSettings(Section):
    lease_s: float = Field(default=10.0, gt=0.5)
    """Length of the leader lease on the database's clock; renewed every third of it."""
    vip: str = ""
    """Floating address keepalived keeps on the leader (``server add --vip``); empty: none."""


class MirrorSettings(Section):
    copies: int = Field(default=0, ge=0)
    """Control planes that must hold a blob before its import answers; 0: every control plane, at most 2."""
    concurrency: int = Field(default=2, ge=1)
    """Blobs this control plane pulls from its peers at once."""
    interval_s: float = Field(default=2.0, gt=0)
    """Seconds between looks for blobs this control plane lacks (and an import's looks for copies)."""
    ack_wait_s: float = Field(default=20.0, ge=0)
    """Longest an import waits for live peers to pull its blob before it answers with fewer copies
    (kept under the 30 s clients wait for an answer; the peers go on pulling after it)."""
    max_upload_bytes: int = Field(default=256 << 30, gt=0)
    """Largest file one upload (``POST /api/mirror/blobs``, ``llmgw mirror import``) may bring."""
    quota_bytes: int = Field(default=1 << 40, ge=0)
    """Bytes of blobs each user may hold in the mirror by uploads (a cluster admin: no bound); past
    it, an upload answers 413 until the user removes blobs (``llmgw ctl mirror rm``)."""
    quotas: dict[str, int] = Field(default_factory=dict)
    """Per-user exceptions to ``quota_bytes``: a user's name and the bytes that user may hold."""

    @field_validator("quotas")
    @classmethod
    def _quotas(cls, value: dict[str, int]) -> dict[str, int]:
        negative = sorted(user for user, size in value.items() if size < 0)
        if negative:
            raise ValueError(f"a quota is a number of bytes, 0 or more; {', '.join(negative)} has less")
        return value

    def quota_of(self, user: str) -> int:
        """The bytes ``user`` may hold in the mirror."""
        return self.quotas.get(user, self.quota_bytes)


class GatewaySettingsFile(Section):
    request_wait_s: float = 60.0
    """How long a request waits for a replica to become ready before a 503."""
    upstream_timeout_s: float = 600.0
    """How long a request may take on its engine."""
    provider_ca_file: str = ""
    """A PEM file of CAs trusted for ``https://`` providers besides the system's (docs/providers.md)."""
    access_log: bool = False
    """Log one line per /v1 request (logger ``llmgw.access``): status, duration, tokens. Off costs nothing."""
    workers: int = Field(default=0, ge=0, le=64)
    """Gateway worker processes sharing the HTTP port (``SO_REUSEPORT``), each serving /v1 from its own
    copy of the gateway's state; 0: one fewer than the machine's cores, at most 8 (on two cores: this
    process alone); 1: this process alone serves."""
    job_poll_s: float = Field(default=0.5, gt=0)
    """How often a ComfyUI job's progress is read from its gate (docs/comfyui-api.md)."""
    job_timeout_s: float = Field(default=3600.0, gt=0)
    """Longest a job or a picture may take; past it, it fails and is cancelled on its gate."""
    jobs_kept: int = Field(default=1000, gt=0)
    """Jobs held in memory at most."""
    job_kept_s: float = Field(default=3600.0, gt=0)
    """How long an ended job can still be read."""
    job_orphan_s: float = Field(default=10.0, gt=0)
    """How long a job's process may leave it unwritten (it writes it at least every 2 s while it
    follows it) before the leader takes it over and follows it on its replica's gate."""
    files_kept_s: float = Field(default=3600.0, gt=0)
    """How long a made file (a picture's url, a job's files) can be read at /v1/files/{id}."""
    files_max_bytes: int = Field(default=1024 * 1024 * 1024, gt=0)
    """Bytes of made files kept in memory at most; the oldest go first."""
    responses_kept_s: float = Field(default=3600.0, gt=0)
    """How long a response is kept (in the store) for ``previous_response_id`` and
    ``GET /v1/responses/{id}`` (docs/openai.md)."""
    responses_per_key: int = Field(default=1000, gt=0)
    """Responses kept per key at most; past it the key's oldest go as it keeps more."""
    responses_total: int = Field(default=50_000, gt=0)
    """Responses kept in all at most; the leader removes the oldest past it every 30 s."""
    fallbacks: FallbackSettings = Field(default_factory=FallbackSettings)
    """A request's retry budget past its model (``max_targets``, ``budget_s``) and the fallback
    targets' circuit breakers (``breaker_failures`` in ``breaker_window_s``, open ``breaker_open_s``);
    docs/placement.md#fallbacks."""
    flow: FlowSettings = Field(default_factory=FlowSettings)
    """Whether a busy model's requests wait in the gateway by priority and fair share (``mode: fair``)
    or go to an engine's queue at once (``fifo``); docs/routing.md#flow-control."""


class BatchSettingsFile(Section):
    share: float = Field(default=0.25, gt=0, le=1)
    """Part of a model's slots batch requests may fill: they are sent only while the requests its
    engines report (interactive ones first) stay under it (docs/batches.md)."""
    most_at_once: int = Field(default=16, ge=1)
    """Most requests of one batch in flight at once, whatever the headroom."""
    retry_s: float = Field(default=2.0, gt=0)
    """How long a batch request answered "not now" (429, 502, 503, 504) waits before it is sent again."""
    kept_s: float = Field(default=30 * 24 * 3600.0, gt=0)
    """How long an ended batch can still be read (its files live as long as files do)."""


class FileSettingsFile(Section):
    max_bytes: int = Field(default=512 << 20, gt=0)
    """Largest file ``/v1/files`` takes (OpenAI's bound: 512 MiB)."""
    place_max_bytes: int = Field(default=100 << 30, gt=0)
    """Most bytes of files one place (a project, a team, an organization) keeps; past it, an upload
    answers 413 until files are deleted or expire."""
    batch_kept_s: float = Field(default=30 * 24 * 3600.0, gt=0)
    """How long a file uploaded for a batch, and a batch's output and errors, are kept unless its
    upload says otherwise (``expires_after``); other files are kept until deleted."""
    sweep_s: float = Field(default=60.0, gt=0)
    """How often the leader deletes the files past their expiry."""


class ServerConfig(ConfigFile):
    name: str = "cp1"
    """This control plane's name (its certificate's common name)."""
    data_dir: str = "."
    """Where the SQLite store, the mirror's blobs and the state live (relative: to the config's directory)."""
    admin_token_sha256: str = ""
    """sha256 of the admin token (the token itself is in ``admin.token`` beside the config)."""
    store: StoreSettings = Field(default_factory=StoreSettings)
    http: HttpSettings = Field(default_factory=HttpSettings)
    agent_server: AgentServerSettings = Field(default_factory=AgentServerSettings)
    tls: TlsSettings = Field(default_factory=TlsSettings)
    reconcile: ReconcileSettings = Field(default_factory=ReconcileSettings)
    leadership: LeadershipSettings = Field(default_factory=LeadershipSettings)
    gateway: GatewaySettingsFile = Field(default_factory=GatewaySettingsFile)
    mirror: MirrorSettings = Field(default_factory=MirrorSettings)
    """How many control planes hold each blob, and how they pull from each other (docs/mirror.md)."""
    routing: RoutingSettings = Field(default_factory=RoutingSettings)
    """How the router chooses among a model's replicas (policy, saturation, prefix tree size)."""
    tracing: TracingSettings = Field(default_factory=TracingSettings)
    """OpenTelemetry spans of reconcile passes, replica starts and /v1 requests over OTLP (off by default)."""
    release: ReleaseSettings = Field(default_factory=ReleaseSettings)
    """The key releases and bundles must be signed by (``release.trusted_pub``)."""
    training: TrainingSettings = Field(default_factory=TrainingSettings)
    """Training jobs (docs/training.md): how long a node running one may be away."""
    batches: BatchSettingsFile = Field(default_factory=BatchSettingsFile)
    files: FileSettingsFile = Field(default_factory=FileSettingsFile)
    """How the leader runs batches (``/v1/batches``) on the capacity interactive traffic leaves free."""

    @property
    def data_path(self) -> Path:
        return self.path(self.data_dir)

    @property
    def store_url(self) -> str:
        return self.store.url or f"sqlite+aiosqlite:///{self.data_path / 'llmgw.db'}"


def load_server_config(path: Path) -> ServerConfig:
    """Read server.yaml, naming the file and each bad field when it cannot be used."""
    data = read_yaml(path, "create one with 'llmgw server init'")
    return validate(ServerConfig, data, str(path), path.parent)


def save_server_config(config: ServerConfig, path: Path) -> None:
    save(config, path)
