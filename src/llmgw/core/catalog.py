"""The catalog's types: what a model is, and how its definition is checked.

A definition arrives as YAML, JSON or CLI flags; :func:`parse_model` turns it
into a :class:`ModelDefinition` or raises :class:`~llmgw.errors.ValidationFailed`
naming every field that is wrong.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from llmgw.core.comfyui import ComfyUISection
from llmgw.core.engines import (
    COMFYUI,
    DEFAULT_ENGINE,
    ENGINE_NAMES,
    POOLINGS,
    AdapterShape,
    EngineCapabilities,
    Task,
    WeightsFormat,
    either,
    engines_where,
    find_engine,
)
from llmgw.core.fallbacks import FallbackFields
from llmgw.core.filenames import safe_filename
from llmgw.core.mig import Spread, mig_refusal
from llmgw.core.providers import ProviderFields
from llmgw.core.requestbounds import RequestLimits
from llmgw.core.tenancy import Owner, owner_text
from llmgw.core.validation import check_args, check_env
from llmgw.errors import ValidationFailed

NAME_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}")
SHA256_PATTERN = re.compile(r"[0-9a-f]{64}")
COMFYUI_ENGINE = COMFYUI.name
"""The engine a model with a ``comfyui:`` section runs."""
COMFYUI_SECTION = COMFYUI.name
"""A model definition's ``comfyui:`` section, named after the engine it configures."""
PEFT_CONFIG = "adapter_config.json"
"""The file that makes a folder a PEFT adapter (vLLM reads it beside the weights)."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _sha256(value: str) -> str:
    value = value.removeprefix("sha256:").lower()
    if not SHA256_PATTERN.fullmatch(value):
        raise ValueError("must be 64 hexadecimal digits (the file's sha256)")
    return value


def _plain_name(value: str) -> str:
    if "/" in value or value.startswith(".") or not value:
        raise ValueError("must be a plain file name, without '/' or a leading '.'")
    return safe_filename(value)


class Projector(Strict):
    """A vision model's projector, kept in the mirror beside the weights (llama.cpp ``--mmproj``)."""

    sha256: str
    """The projector file's sha256."""
    filename: str = "mmproj.gguf"
    """The name the engine sees the file under."""
    size: int = Field(default=0, ge=0)

    _sha = field_validator("sha256")(_sha256)
    _filename = field_validator("filename")(_plain_name)


class SourceFile(Strict):
    """One more file of a safetensors repository (config, tokenizer, further shards), kept in the mirror."""

    sha256: str
    filename: str
    """Its name in the repository's folder."""
    size: int = Field(default=0, ge=0)

    _sha = field_validator("sha256")(_sha256)
    _filename = field_validator("filename")(_plain_name)


class Source(Strict):
    """Where a model's weights come from: a file kept in the mirror by sha256."""

    format: Literal["gguf", "safetensors"] = "gguf"
    """``gguf`` (one file, llama.cpp) or ``safetensors`` (weights with config and tokenizer, vLLM,
    SGLang, TensorRT-LLM)."""
    projector: Projector | None = None
    """A GGUF vision model's projector."""
    files: tuple[SourceFile, ...] = ()
    """The rest of a safetensors repository, fetched into one folder beside the weights file."""
    sha256: str
    """The weights file's sha256, as the mirror keeps it (``llmgw mirror import`` prints it)."""
    filename: str = "model.gguf"
    """The name the engine sees the file under."""
    size: int = Field(default=0, ge=0)
    """Bytes; 0 when unknown. Used to estimate the memory a replica needs."""

    _sha = field_validator("sha256")(_sha256)
    _filename = field_validator("filename")(_plain_name)

    @model_validator(mode="after")
    def _projector_with_gguf(self) -> Source:
        if self.projector is not None and self.format != "gguf":
            raise ValueError("a projector goes with GGUF weights; safetensors repositories carry their own")
        if self.files and self.format != "safetensors":
            raise ValueError("files belong to a safetensors repository; a GGUF model is one file")
        names = [self.filename, *(f.filename for f in self.files)]
        if len(set(names)) != len(names):
            raise ValueError("two files of the repository have the same name")
        return self


class Profile(Strict):
    """How to run the model: which engine, on what, with which arguments."""

    engine: str = DEFAULT_ENGINE
    """The inference engine (a name of :data:`llmgw.core.engines.ENGINES`)."""
    memory_mb: int | None = Field(default=None, gt=0)
    """Memory a replica needs; when unset, 1.25 x the weights + the engine's runtime (256 MiB;
    vLLM 3.25 GiB: its processes and a 1 GiB KV cache)."""
    ctx_size: int = Field(default=4096, gt=0, le=1_048_576)
    """The context of one request, in tokens (prompt and answer), on every engine: llama.cpp is
    started with ``--ctx-size`` ctx_size x parallel (its context is shared by its slots), vLLM
    with ``--max-model-len``, SGLang ``--context-length``, TensorRT-LLM ``--max_seq_len``."""
    parallel: int = Field(default=4, ge=1, le=256)
    """Requests one replica serves at once."""
    gpu_class: str | None = None
    """The class of card a replica needs (``a100-80g``, ``h100``); None: any with the memory."""
    tp: int = Field(default=1, ge=1, le=64)
    """Tensor-parallel degree: the cards one replica spans (vLLM, SGLang, TensorRT-LLM)."""
    pp: int = Field(default=1, ge=1, le=64)
    """Pipeline-parallel degree: stages one replica is cut into; tp x pp cards in all."""
    gpus: int | None = Field(default=None, ge=1, le=64)
    """Cards one replica takes on each of its nodes; unset: tp x pp / nodes."""
    nodes: int = Field(default=1, ge=1, le=64)
    """Nodes one replica spans; gpus x nodes = tp x pp."""
    kv_events: bool = False
    """vLLM publishes its KV-cache events to the agent, for exact prefix routing."""
    max_loaded_adapters: int = Field(default=0, ge=0, le=256)
    """vLLM: LoRA adapters held at once per replica, loaded at run time (0: all at start)."""
    args: tuple[str, ...] = ()
    """Extra engine arguments."""
    env: dict[str, str] = Field(default_factory=dict)
    """Extra environment for the engine."""
    serves: Task = Task.CHAT
    """What a replica serves: ``chat`` (chat completions, completions, responses), ``embeddings``
    or ``rerank``; the engine is started for it and the gateway sends it only those routes."""
    pooling: str | None = None
    """llama.cpp: the pooling an embedding model needs (none, mean, cls, last, rank); unset: the
    model's own."""
    request_limits: RequestLimits = Field(default_factory=RequestLimits)
    """The sizes a request may ask (logit_bias entries, stop strings, messages, tools, n, inputs),
    checked by the gateway before the engine sees it (docs/openai.md)."""
    request_timeout_s: float | None = Field(default=None, gt=0, le=86_400)
    """Longest a request may take on its engine, from being sent to its answer's end: past it the
    gateway closes the engine's request and answers 504 ``request_timeout``; unset: no limit but
    ``gateway.upstream_timeout_s`` of silence. A model whose profiles differ gets the longest (none
    when one has none)."""

    @field_validator("engine")
    @classmethod
    def _engine(cls, value: str) -> str:
        if find_engine(value) is None:
            raise ValueError(f"unknown engine {value!r}; known: {', '.join(ENGINE_NAMES)}")
        return value

    @field_validator("args")
    @classmethod
    def _args(cls, value: tuple[str, ...], info: ValidationInfo) -> tuple[str, ...]:
        refusals = check_args(str(info.data.get("engine", DEFAULT_ENGINE)), value)
        if refusals:
            raise ValueError("; ".join(str(r) for r in refusals))
        return value

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        refusals = check_env(str(info.data.get("engine", DEFAULT_ENGINE)), value)
        if refusals:
            raise ValueError("; ".join(str(r) for r in refusals))
        return value

    @property
    def capabilities(self) -> EngineCapabilities:
        """The row of the profile's engine (a validated profile names a known one)."""
        caps = find_engine(self.engine)
        assert caps is not None, f"profile names unknown engine {self.engine!r}"
        return caps

    @model_validator(mode="after")
    def _engine_features(self) -> Profile:
        caps = self.capabilities
        if self.serves not in caps.tasks:
            wanted = either(engines_where(lambda row: self.serves in row.tasks))
            raise ValueError(f"serves: {self.serves} needs engine {wanted}; {caps.title} serves chat only")
        if self.pooling is not None:
            if not caps.pooling_flag:
                raise ValueError(f"pooling is a llama.cpp setting; {caps.title} takes the model's own")
            if self.pooling not in POOLINGS:
                raise ValueError(f"pooling {self.pooling!r} is not one of {', '.join(POOLINGS)}")
            if self.serves is Task.CHAT:
                raise ValueError("pooling is for embeddings or rerank; set serves: embeddings (or rerank)")
        if self.kv_events and not caps.kv_events:
            wanted = either(engines_where(lambda row: row.kv_events))
            raise ValueError(f"kv_events needs engine {wanted}; {self.engine} publishes none")
        if self.max_loaded_adapters and not caps.runtime_adapters:
            wanted = either(engines_where(lambda row: row.runtime_adapters))
            raise ValueError(
                f"max_loaded_adapters needs engine {wanted}; {self.engine} loads adapters at start"
            )
        if self.tp > 1 and not caps.tensor_parallel:
            wanted = either(engines_where(lambda row: row.tensor_parallel))
            raise ValueError(f"tp needs engine {wanted}; {self.engine} takes no tensor-parallel degree")
        if (self.tp > 1 or self.pp > 1 or self.nodes > 1) and not caps.tensor_parallel:
            wanted = either(engines_where(lambda row: row.tensor_parallel))
            raise ValueError(f"pp and nodes need engine {wanted}; {self.engine} runs on one device")
        cards = self.tp * self.pp
        if cards % self.nodes:
            raise ValueError(
                f"tp x pp ({cards}) cards do not split evenly over {self.nodes} nodes; "
                "make tp x pp a multiple of nodes"
            )
        if self.gpus is not None and self.gpus * self.nodes != cards:
            raise ValueError(
                f"gpus ({self.gpus}) x nodes ({self.nodes}) must equal tp x pp ({cards}): "
                f"set gpus to {cards // self.nodes} or leave it unset"
            )
        if self.gpu_class and (refusal := mig_refusal(self.gpu_class, self.spread)):
            raise ValueError(refusal)
        return self

    @property
    def gpus_per_node(self) -> int:
        """Cards one replica takes on each of its nodes."""
        return self.gpus if self.gpus is not None else self.tp * self.pp // self.nodes

    @property
    def spread(self) -> Spread:
        """How one replica spreads over devices and nodes (placement's view of the profile)."""
        return Spread(tp=self.tp, pp=self.pp, gpus=self.gpus_per_node, nodes=self.nodes)


class Adapter(Strict):
    """A LoRA adapter of the model, served under its own name on the model's replicas.

    vLLM: a PEFT adapter, a folder of ``adapter_model.safetensors`` (the weights,
    ``sha256``) and ``adapter_config.json`` (in ``files``). llama.cpp: one GGUF
    LoRA file. Every file is kept in the mirror by sha256, as the model's weights are.
    """

    name: str
    """The name clients ask for in ``model`` (unique across the catalog's models and adapters)."""
    sha256: str
    """The adapter weights file's sha256, as the mirror keeps it (``llmgw mirror import`` prints it)."""
    filename: str = ""
    """The weights file's name; empty: ``adapter_model.safetensors`` (vLLM), ``adapter.gguf`` (llama.cpp)."""
    size: int = Field(default=0, ge=0)
    """Bytes; 0 when unknown (the control plane fills it in)."""
    files: tuple[SourceFile, ...] = ()
    """vLLM: the rest of the PEFT folder, ``adapter_config.json`` at least."""
    scale: float | None = None
    """llama.cpp: how strongly the adapter applies (``--lora-scaled``); None: 1.0."""
    rank: int | None = Field(default=None, ge=1, le=512)
    """vLLM: the adapter's LoRA rank (PEFT's ``r``); vLLM gets a ``--max-lora-rank`` holding the largest."""
    owner: str = ""
    """Who owns the adapter (``org:…``, ``team:…``, ``project:…``, ``user:…``); empty: the model's owner.
    Only keys there see it (:mod:`llmgw.core.tenancy`); it must be at or below the model's owner."""

    _owner = field_validator("owner")(owner_text)

    _sha = field_validator("sha256")(_sha256)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return _model_name(value)

    @field_validator("filename")
    @classmethod
    def _filename(cls, value: str) -> str:
        return _plain_name(value) if value else value

    @field_validator("scale")
    @classmethod
    def _scale(cls, value: float | None) -> float | None:
        if value is not None and not (math.isfinite(value) and -100 <= value <= 100):
            raise ValueError("must be a number between -100 and 100 (1.0 applies the adapter fully)")
        return value

    def weights_filename(self, engine: str) -> str:
        """The weights file's name on the node: the given one, or the engine's adapter shape's."""
        caps = find_engine(engine)
        return self.filename or (caps.adapter_shape if caps else AdapterShape.NONE).weights_filename


def adapter_problems(engine: str, model_name: str, adapters: Iterable[Adapter]) -> list[tuple[str, str]]:
    """What is wrong with a model's adapters for its engine: ``(field.path, why)`` pairs."""
    problems: list[tuple[str, str]] = []
    seen: set[str] = set()
    caps = find_engine(engine)
    for index, adapter in enumerate(adapters):
        at = f"adapters.{index}"
        if caps is None or not caps.serves_adapters:
            wanted = either(engines_where(lambda row: row.serves_adapters))
            problems.append((at, f"engine {engine} serves no LoRA adapters; use engine {wanted}"))
            continue
        if adapter.name == model_name:
            problems.append((f"{at}.name", "is the model's own name; give the adapter a name of its own"))
        elif adapter.name in seen:
            problems.append((f"{at}.name", f"two adapters are called {adapter.name!r}; rename one"))
        seen.add(adapter.name)
        problems += _shape_problems(caps, adapter, at)
        if adapter.rank is not None and not caps.adapter_ranks:
            wanted = either(engines_where(lambda row: bool(row.adapter_ranks)))
            problems.append((f"{at}.rank", f"{caps.title} reads the rank from the adapter file; rank is "
                             f"for engine {wanted}: remove it"))  # fmt: skip
        if adapter.scale is not None and not caps.adapter_scale:
            wanted = either(engines_where(lambda row: row.adapter_scale))
            problems.append((f"{at}.scale", f"{caps.title} applies the adapter as trained; scale is for "
                             f"engine {wanted}: remove it"))  # fmt: skip
    return problems


def _shape_problems(caps: EngineCapabilities, adapter: Adapter, at: str) -> list[tuple[str, str]]:
    """What is wrong with the adapter's files for the shape of adapter its engine takes."""
    problems: list[tuple[str, str]] = []
    shape = caps.adapter_shape
    filename = adapter.weights_filename(caps.name)
    refused = sorted(set(caps.adapter_filename_refuses) & set(filename))
    if not filename.endswith(shape.suffixes):
        if shape is AdapterShape.GGUF_FILE:
            why = f"a {caps.title} adapter is one GGUF file: name it *.gguf"
        else:
            gguf = either(engines_where(lambda row: row.adapter_shape is AdapterShape.GGUF_FILE))
            why = (
                "a PEFT adapter's weights are adapter_model.safetensors (or .bin); "
                f"a GGUF adapter needs engine {gguf}"
            )
        problems.append((f"{at}.filename", why))
    elif refused:
        chars = " and ".join(repr(c) for c in refused)
        problems.append(
            (
                f"{at}.filename",
                f"{caps.title} splits its adapter list at {chars}; rename the file without them",
            )
        )
    if shape is AdapterShape.GGUF_FILE and adapter.files:
        problems.append((f"{at}.files", f"a {caps.title} adapter is one GGUF file; remove files"))
    if shape is AdapterShape.PEFT_FOLDER:
        names = [filename, *(f.filename for f in adapter.files)]
        if PEFT_CONFIG not in names:
            why = f"a PEFT adapter needs its {PEFT_CONFIG}: import it into the mirror and list it in files"
            problems.append((f"{at}.files", why))
        if len(set(names)) != len(names):
            problems.append((f"{at}.files", "two files of the adapter have the same name"))
    return problems


def name_clashes(model: ModelDefinition, others: Iterable[ModelDefinition]) -> list[tuple[str, str]]:
    """Names of ``model`` (its own, its adapters') that another catalog entry already uses."""
    taken: dict[str, str] = {}
    for other in others:
        if other.name == model.name:
            continue
        taken[other.name] = f"model {other.name!r}"
        for adapter in other.adapters:
            taken[adapter.name] = f"an adapter of model {other.name!r}"
    problems = []
    if model.name in taken:
        problems.append(("name", f"is already the name of {taken[model.name]}; choose another name"))
    for index, adapter in enumerate(model.adapters):
        if adapter.name in taken:
            why = f"is already the name of {taken[adapter.name]}; choose another name"
            problems.append((f"adapters.{index}.name", why))
    return problems


def _model_name(value: str) -> str:
    if not NAME_PATTERN.fullmatch(value):
        raise ValueError(
            "must start with a letter or digit and hold only letters, digits and . _ : / - (128 at most)"
        )
    return value


class Replicas(Strict):
    min: int = Field(default=1, ge=0, le=1024)
    """Replicas kept running at all times (0 with on_demand: start when asked)."""
    max: int = Field(default=1, ge=1, le=1024)
    """Replicas at most: between min and max the count follows the load (:mod:`llmgw.core.scaling`)."""
    ttft_target_ms: int | None = Field(default=None, gt=0, le=600_000)
    """Scale up while the recent time to first token is above this; None: load alone decides."""
    scale_up_cooldown_s: float = Field(default=30, ge=0, le=86_400)
    """Seconds after a change before one more replica is added."""
    scale_down_cooldown_s: float = Field(default=300, ge=0, le=86_400)
    """Seconds the load must stay low (and since the last change) before a replica is drained."""
    drain_timeout_s: float = Field(default=60, ge=0, le=86_400)
    """Seconds a draining replica's requests get to finish before it is stopped anyway."""

    @model_validator(mode="after")
    def _order(self) -> Replicas:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) is larger than max ({self.max})")
        return self


class ModelDefinition(Strict, FallbackFields, ProviderFields):
    """A catalog entry (its fallbacks: :mod:`llmgw.core.fallbacks`; provider: :mod:`llmgw.core.providers`)."""

    name: str
    """The name clients ask for in ``model``."""
    source: Source | None = Field(default=None, validate_default=True)  # required unless provider
    profiles: tuple[Profile, ...] = Field(default_factory=lambda: (Profile(),), max_length=16)
    """How to run the model, tried in order: placement takes the first profile some node fits.
    The single ``profile:`` of older definitions reads as a list of one."""
    replicas: Replicas = Field(default_factory=Replicas)
    priority: int = Field(default=0, ge=-1000, le=1000)
    """A replica that fits nowhere evicts replicas of lower-priority models (drained first)."""
    on_demand: bool = False
    """Start a replica when a request arrives and none runs; stop it after ``idle_timeout_s``."""
    idle_timeout_s: int = Field(default=600, ge=10)
    """Seconds without a request after which an on-demand model's replicas stop."""
    owner: str = ""
    """Who owns the model: empty (the cluster: every key sees it), ``org:ORG``, ``team:ORG/TEAM``,
    ``project:ORG/TEAM/PROJECT`` or ``user:NAME`` (only keys there see it; :mod:`llmgw.core.tenancy`)."""
    adapters: tuple[Adapter, ...] = ()
    """LoRA adapters served on the model's replicas, each under its own name: all given to the
    engine at start, or (vLLM with ``profile.max_loaded_adapters`` N) loaded when first asked for."""
    comfyui: ComfyUISection | None = None
    """A ComfyUI model's workflow, custom nodes, licence and environment (:mod:`llmgw.core.comfyui`)."""

    @model_validator(mode="after")
    def _comfyui_engine(self) -> ModelDefinition:
        if self.comfyui is not None and find_engine(COMFYUI_ENGINE) is not None:
            others = sorted({p.engine for p in self.profiles} - {COMFYUI_ENGINE})
            if others:
                raise ValueError(
                    f"comfyui: runs on engine {COMFYUI_ENGINE}, but profiles name {', '.join(others)}"
                )
        return self

    @model_validator(mode="before")
    @classmethod
    def _one_profile_is_a_list_of_one(cls, data: Any) -> Any:
        if isinstance(data, dict) and "profile" in data:
            if "profiles" in data:
                raise ValueError("give either profile (one) or profiles (a list tried in order), not both")
            profile = data["profile"]
            data = {k: v for k, v in data.items() if k != "profile"}
            data["profiles"] = [profile]
        return data

    @model_validator(mode="after")
    def _format_fits_engine(self) -> ModelDefinition:
        given = WeightsFormat(self.source.format if self.source else self.profile.capabilities.weights_format)
        for index, profile in enumerate(self.profiles):
            runs = profile.capabilities.weights_format
            if given is not runs:
                others = either(engines_where(lambda row: row.weights_format is given))
                at = f"profiles.{index}: " if len(self.profiles) > 1 else ""
                raise ValueError(
                    f"{at}engine {profile.engine} runs {runs.label} weights, not {given.label}; set "
                    f"source.format: {runs.value} or use engine {others} for {given.label}"
                )
        return self

    @field_validator("profiles")
    @classmethod
    def _some_profile(cls, value: tuple[Profile, ...]) -> tuple[Profile, ...]:
        if not value:
            raise ValueError("needs at least one profile; remove profiles to run on the defaults")
        served = sorted({profile.serves.value for profile in value})
        if len(served) > 1:
            raise ValueError(
                f"every profile of a model serves the same thing (its clients call the same routes), "
                f"but these serve {', '.join(served)}: define one model per task"
            )
        return value

    @model_validator(mode="after")
    def _adapters_on_one_engine(self) -> ModelDefinition:
        engines = sorted({profile.engine for profile in self.profiles})
        if self.adapters and len(engines) > 1:
            raise ValueError(
                f"a model with adapters serves them the same way on every replica, but its profiles "
                f"name engines {', '.join(engines)}: use one engine in every profile"
            )
        return self

    @property
    def profile(self) -> Profile:
        """The first profile: what the model's name-level facts (adapters, the gateway's view) go by."""
        return self.profiles[0]

    _owner = field_validator("owner")(owner_text)

    @model_validator(mode="after")
    def _adapters_within_owner(self) -> ModelDefinition:
        owner = Owner.parse(self.owner)
        for adapter in self.adapters:
            if adapter.owner and not Owner.parse(adapter.owner).within(owner):
                raise ValueError(
                    f"adapter {adapter.name!r} is owned by {adapter.owner}, outside the model's owner "
                    f"({self.owner or 'the cluster'}); own it at or below the model's owner"
                )
        return self

    def owned_by(self) -> Owner:
        """The model's owner (:class:`~llmgw.core.tenancy.Owner`)."""
        return Owner.parse(self.owner)

    def adapter_owner(self, adapter: Adapter) -> Owner:
        """Who owns ``adapter``: its own owner, else the model's."""
        return Owner.parse(adapter.owner or self.owner)

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return _model_name(value)

    def max_lora_rank(self) -> int:
        """The largest rank the adapters declare (0: none declares one)."""
        return max((a.rank or 0 for a in self.adapters), default=0)

    def memory_needed_mb(self, profile: Profile | None = None) -> int:
        """Memory one replica needs on ``profile`` (else the first), declared or estimated."""
        profile = profile if profile is not None else self.profile
        if profile.memory_mb is not None:
            return profile.memory_mb
        total = self.source.size + sum(f.size for f in self.source.files) if self.source else 0
        total += sum(a.size for a in self.adapters)
        return int(total * 1.25 / 2**20) + profile.capabilities.runtime_mb

    def wanted_replicas(self, demanded: bool) -> int:
        """Replicas the reconciler keeps: ``min``, or one while an on-demand model is in use."""
        if self.on_demand and demanded:
            return max(self.replicas.min, 1)
        return 0 if self.provider is not None else self.replicas.min


def problems_of(error: ValidationError) -> list[tuple[str, str]]:
    """Turn pydantic's errors into ``(field.path, why)`` pairs a person can read."""
    problems = []
    for item in error.errors():
        field = ".".join(str(part) for part in item["loc"])
        kind = item["type"]
        if kind == "extra_forbidden":
            why = "unknown field; remove it or check its spelling"
        elif kind == "missing":
            why = "required"
        else:
            why = str(item["msg"]).removeprefix("Value error, ")
        problems.append((field, why))
    return problems


def one_profile_field(field: str) -> str:
    """``profiles.0.tp`` as a definition with one ``profile`` names it: ``profile.tp``."""
    if field == "profiles.0" or field.startswith("profiles.0."):
        return "profile" + field.removeprefix("profiles.0")
    return field


def parse_model(data: Any) -> ModelDefinition:
    """A :class:`ModelDefinition` from plain data, or :class:`ValidationFailed` naming each bad field."""
    if not isinstance(data, dict):
        raise ValidationFailed([("", "a model definition must be a mapping of fields")])
    try:
        model = ModelDefinition.model_validate(data)
    except ValidationError as error:
        problems = problems_of(error)
        if "profile" in data and "profiles" not in data:  # named as the definition names them
            problems = [(one_profile_field(field), why) for field, why in problems]
        raise ValidationFailed(problems, "fix the fields named and try again") from None
    problems = adapter_problems(model.profile.engine, model.name, model.adapters)
    if problems:
        raise ValidationFailed(problems, "fix the adapters named and try again")
    return model
