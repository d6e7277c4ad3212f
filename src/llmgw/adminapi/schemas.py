"""The admin API's request and answer shapes, one pydantic model each.

The server declares them on its routes (so ``/api/openapi.json`` describes
every route) and the command line parses its answers into them (so ``ctl``
reads attributes, not dictionary keys). Answers ignore fields they do not
know, so an older client still reads a newer control plane; requests refuse
them, naming the field.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, JsonValue, RootModel

from llmgw.adminapi.textfields import KEY_NAME, KEY_OWNER, KEY_PLACE, keepable, unicode_only
from llmgw.core.catalog import ModelDefinition
from llmgw.core.health import ComponentState
from llmgw.core.tenancy import owner_text


class RequestModel(BaseModel):
    """A request body: unknown fields are refused by name."""

    model_config = ConfigDict(extra="forbid")


class AnswerModel(BaseModel):
    """An answer body: unknown fields are ignored (a newer control plane may add some)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)


# errors


class Problem(AnswerModel):
    field: str
    """The field at fault, as a dotted path (empty: the whole body)."""
    problem: str
    """What is wrong with it."""


class ErrorDetail(AnswerModel):
    message: str
    """What was wrong."""
    hint: str = ""
    """What to do about it."""
    problems: list[Problem] | None = None
    """Each field at fault (400 answers only)."""


class ErrorBody(AnswerModel):
    """Every error answer of the admin API."""

    error: ErrorDetail


# status, serving, leadership


class Health(AnswerModel):
    status: str = "ok"
    instance: str = ""
    """This start of the process: a new one after every restart (``llmgw restart``)."""


class LeaderView(AnswerModel):
    """``/leader``: 200 while this control plane leads, 503 with the same body otherwise."""

    leader: bool
    name: str
    state: str
    holder: str


class ControlPlaneView(AnswerModel):
    name: str
    role: str
    """``leader`` or ``standby``."""
    http: str
    agents: str
    seen_ago_s: float


class ComponentView(AnswerModel):
    """A supervised component of the answering control plane."""

    name: str
    state: ComponentState
    restarts: int = 0
    last_error: str = ""
    """The last failure, as ``Type: message`` (empty: none yet)."""
    last_error_at: float | None = None
    """When it failed last, as a Unix timestamp."""


class RefusedSettingsView(AnswerModel):
    """Settings from the control plane a node's agent could not start on; it runs on its last good ones."""

    settings: str
    """The refused settings, as YAML."""
    keys: str
    """The refused settings flattened, ``work_dir=/proc/x, shards.stop_grace_s=2``."""
    reason: str
    """Why the agent could not start on them."""
    refused_at: float
    """When the agent went back, as a Unix timestamp."""


class ProviderView(AnswerModel):
    """A model served by a provider outside the cluster, as this control plane's gateway saw it."""

    served_by: str
    """The provider's API, its name for the model and its host (``openai gpt-4o at api.openai.com``)."""
    requests: int = 0
    """Requests this plane sent it since it started."""
    last_error: str = ""
    """Its last failure (``429 at 12:03:04 UTC: rate limited``, ``timeout at ...``); empty: none."""


class QueueView(AnswerModel):
    """A busy model's queue in the gateway (``gateway.flow.mode: fair``) on the answering plane."""

    waiting: int = 0
    """Requests waiting now for a slot, in the plane's gateway and its workers."""
    by_flow: dict[str, int] = {}
    """Of those, per flow: the key's project or user (``gateway.flow.fair_by: key``: the key)."""
    last_wait_s: float | None = None
    """How long the latest request sent on had waited (None: none sent on yet)."""

    def summary(self) -> str:
        """In words, as ``ctl status`` and the console show it: who waits (the largest flows first)
        and how long the latest waited."""
        if self.waiting:
            flows = sorted(self.by_flow.items(), key=lambda f: (-f[1], f[0]))
            shown = ", ".join(f"{flow or 'no key'} {count}" for flow, count in flows[:4])
            more = f", {len(flows) - 4} more" if len(flows) > 4 else ""
            text = f"{self.waiting} waiting ({shown}{more})"
        else:
            text = "none waiting"
        if self.last_wait_s is not None:
            text += f", the latest sent on waited {self.last_wait_s:.2f} s"
        return text


class StatusView(AnswerModel):
    """The cluster's summary as the answering control plane sees it."""

    name: str
    """The control plane that answered."""
    version: str
    leader: str
    """The lease holder (empty while a failover is under way)."""
    standbys: list[str]
    control_planes: list[ControlPlaneView] = []
    vip: str = ""
    vip_on_leader: bool = False
    stopped: bool = False
    """``llmgw stop`` is in force: no replicas, /v1 answers 503."""
    uptime_s: int = 0
    nodes: int = 0
    models: int = 0
    replicas: int = 0
    replicas_ready: int = 0
    reconcile_error: str = ""
    unplaced: dict[str, str] = {}
    """Why each model the reconciler cannot place is unplaced."""
    components: list[ComponentView] = []
    refused_settings: dict[str, RefusedSettingsView] = {}
    """Per node: settings its agent could not start on (fix them with ``llmgw ctl config set``)."""
    providers: dict[str, ProviderView] = {}
    """Per model served outside the cluster: where, and how its provider answered this plane."""
    queues: dict[str, QueueView] = {}
    """Per model that has queued on this plane (``gateway.flow.mode: fair``): who waits, the latest wait."""


class ServingRequest(RequestModel):
    stopped: bool
    """true: ``llmgw stop``; false: ``llmgw start``."""


class ServingView(AnswerModel):
    stopped: bool


# nodes and replicas


class GpuView(AnswerModel):
    index: int
    label: str = ""
    """How views show the device: ``3`` for a card, ``1/mig0`` for a MIG instance."""
    name: str
    device_class: str = Field(validation_alias="class", serialization_alias="class")
    memory_mb: int


class NodeView(AnswerModel):
    id: str
    connected: bool
    address: str
    cpu_cores: int
    memory_mb: int
    gpus: list[GpuView]
    engines: list[str]
    replicas: int
    refused_settings: RefusedSettingsView | None = None
    """Settings its agent could not start on (it runs on its last good ones); null when none."""


class ReplicaView(AnswerModel):
    id: str
    model: str
    node: str
    state: str
    """placed, starting, ready, failed, absent."""
    port: int
    on: str
    """Where it computes (e.g. ``cuda:0 16000 MiB``, ``cuda:1/mig0``, ``cpu``); empty until ready."""
    restarts: int
    error: str
    adapters: dict[str, str] = {}
    """Each LoRA adapter's path on the node, by name."""
    profile: int = 1
    """The model's profile it runs (1: the first)."""
    draining: str = ""
    """Why it is draining (scaled down, evicted): it takes no new request and stops once its
    requests are done; empty while it serves."""
    progress: str = ""
    """While its node fetches its files: ``fetching 41 % at 950 MB/s``; empty otherwise."""
    fetched_bytes: int = 0
    """While fetching: bytes of its files on the node so far."""
    fetch_total_bytes: int = 0
    """While fetching: bytes of all its files (0 when not fetching)."""
    fetch_bytes_per_s: float = 0.0
    kv_block_size: int = 0
    """Tokens per KV block, as its engine's KV events report (0: unknown, or no KV events)."""
    kv_mismatch: str = ""
    """Why its engine's KV block hashes disagree with llmgw's: KV-aware routing cannot find its
    blocks (empty while they agree)."""


class ReplicaLogs(AnswerModel):
    replica: str
    node: str
    lines: list[str]


# catalog


class ModelEntry(AnswerModel):
    name: str
    definition: ModelDefinition


class ModelView(AnswerModel):
    name: str
    definition: ModelDefinition | None
    """The stored definition (null when it no longer reads; ``problem`` says why)."""
    replicas: int
    ready: int
    unplaced: str = ""
    problem: str = ""
    provider_error: str = ""
    """A provider model's last failure as this plane's gateway saw it (empty: none)."""


# keys


class KeyRequest(RequestModel):
    name: Annotated[str, Field(min_length=1, max_length=KEY_NAME), AfterValidator(keepable)]
    owner: Annotated[str, Field(max_length=KEY_OWNER), AfterValidator(keepable)] = ""
    """A label saying who uses the key (what it sees follows ``place``)."""
    place: Annotated[str, Field(max_length=KEY_PLACE), AfterValidator(owner_text)] = ""
    """Where the key sits: ``project:ORG/TEAM/PROJECT`` or ``user:NAME`` (empty: nowhere, public
    models only; cluster admins only)."""
    collections: Annotated[
        list[Annotated[str, Field(min_length=1, max_length=200), AfterValidator(keepable)]],
        Field(max_length=8),
    ] = []
    """Knowledge collections its chat and Responses requests search when they name none
    (docs/knowledge.md); whether the key may read them is checked when a request searches."""


class KeyView(AnswerModel):
    id: str
    name: str
    prefix: str
    owner: str
    created_at: datetime
    revoked_at: datetime | None
    place: str = ""
    collections: list[str] = []
    """Knowledge collections its requests search when they name none."""


class KeyCreated(AnswerModel):
    id: str
    name: str
    key: str
    """The secret, shown this once."""


# mirror


class BlobCopyView(AnswerModel):
    """A control plane holding a blob."""

    plane: str
    address: str
    """host:port of its agent server, where peers and nodes fetch the blob from it."""
    copied_at: datetime


class BlobView(AnswerModel):
    sha256: str
    size: int
    filename: str
    kind: str
    copies: list[BlobCopyView] = []
    """The control planes holding it, oldest copy first."""
    owner: str = ""
    """The user who uploaded it (empty: the cluster's)."""


class BlobRemoved(AnswerModel):
    sha256: str
    size: int
    filename: str
    owner: str = ""
    note: str = ""
    """What happens to the copies on the control planes."""


class MirrorQuotaView(AnswerModel):
    """A user's room in the mirror (``GET /api/mirror/quota``)."""

    user: str
    used_bytes: int
    """Bytes of the blobs the user uploaded."""
    quota_bytes: int | None
    """Bytes the user may hold (server.yaml ``mirror.quota_bytes``, or ``mirror.quotas``); None: no
    bound (a cluster admin)."""
    max_upload_bytes: int
    """The largest one upload may be (``mirror.max_upload_bytes``)."""


class BlobImported(AnswerModel):
    sha256: str
    size: int
    filename: str
    copies: list[str] = []
    """The control planes holding it when the import answered."""
    wanted: int = 1
    """The copies wanted (server.yaml ``mirror.copies``; every plane, at most 2, by default)."""
    note: str = ""
    """How the copies stand: all held, or who still pulls it."""


# settings, audit, agents


class Settings(RootModel[dict[str, JsonValue]]):
    """Every setting that is set, by key."""


class SettingRequest(RequestModel):
    value: Annotated[JsonValue, AfterValidator(unicode_only)]
    """Any JSON; a setting of a known type (``serving.stopped``: a bool) takes that type only."""


class SettingView(AnswerModel):
    key: str
    value: JsonValue


class SettingSet(SettingView):
    """A setting as set, with what looks wrong about it."""

    warnings: list[str] = Field(default_factory=list)
    """What was set but looks wrong (a price for a model the catalog does not hold)."""


class SettingChange(AnswerModel):
    key: str
    value: JsonValue
    deleted: bool
    at: datetime
    actor: str


class AuditEntry(AnswerModel):
    at: datetime
    actor: str
    action: str
    target: str
    detail: dict[str, JsonValue]


class RestartRequest(RequestModel):
    reason: str = Field(default="llmgw restart", max_length=200)


class RestartAnswer(AnswerModel):
    restarted: list[str]
    """The nodes asked to restart."""


class RestartedView(AnswerModel):
    kind: str
    """``agent`` or ``control-plane``."""
    name: str
    """The node, or the control plane."""
    seconds: float
    """From asking it to restart to seeing it back."""


class ClusterRestartAnswer(AnswerModel):
    restarted: list[RestartedView]
    """Each process restarted, in order, once it was back."""
    then: str
    """The control plane that answered: it starts again once this answer is sent."""


class SelfRestartAnswer(AnswerModel):
    name: str
    instance: str
    """The instance that stops; ``/healthz`` answers a new one once it is back."""


# plan


class PlanRefusal(AnswerModel):
    node: str
    reason: str
    """Why this node (and its cards) was turned down, as placement says it."""


class PlanView(AnswerModel):
    model: str
    node: str
    """The node one more replica would go to now (empty: none)."""
    devices: list[int]
    """The cards (or MIG instances) it would take there (empty: host memory)."""
    memory_mb: int
    """The memory one replica needs."""
    replicas: int
    """Replicas placed now."""
    wanted: int
    """Replicas the catalog keeps (``replicas.min``; 0 while serving is stopped)."""
    refused: list[PlanRefusal]
    """Every other connected node, with why it was turned down."""
    device_labels: list[str] = []
    """The same devices as views show them: ``3`` for a card, ``1/mig0`` for a MIG instance."""
    profile: int = 0
    """The profile the replica would run (1: the first; profiles are tried in order); 0 when nowhere."""
    more_nodes: list[str] = []
    """A multi-node replica: the nodes of its other shards, rank 1 first (``node`` is its head)."""
    priority: int = 0
    """The model's priority: a replica that fits nowhere evicts replicas of lower priorities."""
    evict_node: str = ""
    """Where it would go once the replicas named in ``evict`` (and ``waiting_for``) have drained."""
    evict: list[str] = []
    """Replicas of lower priority that would be drained to make room (empty: none, or none would do)."""
    waiting_for: list[str] = []
    """Replicas already draining whose room it would take."""
    kept: list[PlanRefusal] = []
    """Replicas looked at for eviction and not evicted (``node`` holds the replica's id), with why."""
    scaling: str = ""
    """The reconciler's last autoscaling decision for the model, with its reason."""
    problem: str = ""
    """Why the model cannot be planned at all (a stored definition that does not read, no node connected)."""


# presets


class PresetView(AnswerModel):
    name: str
    description: str
    needs: str
    """What the preset needs: files in the mirror, a package, the memory of one replica."""
    definition: JsonValue
    """The model definition ``ctl model add PRESET`` adds (its weights' sha256 filled in when added)."""
