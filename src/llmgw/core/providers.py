"""Providers: a catalog model served by an endpoint outside the cluster.

A model definition with a ``provider:`` section is not placed on the cluster's
cards: the gateway sends its requests to the provider's endpoint, an
OpenAI-compatible API (another llmgw included) or Anthropic's Messages API,
under the same keys, tenancy, limits and usage as a model the cluster runs.

:class:`Provider` is that section; :class:`ProviderFields` is the field a
:class:`~llmgw.core.catalog.ModelDefinition` takes from here, with the rules
that keep a provider model free of what only a placed model has (weights,
profiles, replicas, adapters).

The provider's ``key`` is a secret: the store keeps it sealed, and nothing
shows it again once it is set (:func:`shown_key`, :data:`KEY_SET`).
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from llmgw.core.engines import COMFYUI

KEY_SET = "set"
"""What a definition shows in place of a provider key that is set."""
ANTHROPIC_VERSION = "2023-06-01"
"""The ``anthropic-version`` header sent to an Anthropic provider (the Messages API's current one)."""
PLACED_ONLY = ("source", "profiles", "replicas", "adapters", COMFYUI.name, "on_demand")
"""Fields of a model the cluster places, which a provider model does not take."""
_UPSTREAM_NAME = re.compile(r"[^\s\"\\]{1,256}")


class ProviderApi(StrEnum):
    """The API a provider speaks."""

    OPENAI = "openai"
    """OpenAI's chat completions, completions and embeddings (llmgw, vLLM, and hosted ones)."""
    ANTHROPIC = "anthropic"
    """Anthropic's Messages API: chat completions are translated to it and back."""


class ProviderTimeouts(BaseModel):
    """How long the gateway waits on a provider, in seconds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    connect_s: float = Field(default=5.0, gt=0, le=300)
    """To open the connection (and finish TLS)."""
    first_byte_s: float = Field(default=60.0, gt=0, le=3600)
    """From the request sent to the answer's status line (and between a stream's chunks)."""
    total_s: float = Field(default=600.0, gt=0, le=86_400)
    """From the request sent to the answer's end."""


class Provider(BaseModel):
    """Where a model is served outside the cluster, and how to call it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    api: ProviderApi = ProviderApi.OPENAI
    """``openai`` (an OpenAI-compatible API) or ``anthropic`` (the Messages API)."""
    base_url: str
    """The API's root as its SDK takes it (``https://api.openai.com/v1``, ``https://api.anthropic.com``,
    another llmgw's ``http://host:8080/v1``): ``/v1/...`` routes are sent under it."""
    model: str
    """The provider's name for the model, sent in the request body in place of the catalog name."""
    key: str = Field(default="", repr=False)
    """The provider's secret key (``Authorization: Bearer``, Anthropic: ``x-api-key``); kept sealed in the
    store and shown as ``set`` once it is; empty: none is sent."""
    timeouts: ProviderTimeouts = Field(default_factory=ProviderTimeouts)
    max_concurrency: int = Field(default=16, ge=1, le=10_000)
    """Requests this gateway sends the provider at once; more wait (``gateway.request_wait_s``), then 503."""

    @field_validator("base_url")
    @classmethod
    def _base_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("must be an http:// or https:// URL with a host, e.g. https://api.openai.com/v1")
        if parts.query or parts.fragment or parts.username or parts.password:
            raise ValueError("must hold no query, fragment or credentials; give the key in key")
        try:
            parts.port  # noqa: B018 - raises on a port out of range
        except ValueError:
            raise ValueError("its port must be a number from 1 to 65535") from None
        return value.rstrip("/")

    @field_validator("model")
    @classmethod
    def _model(cls, value: str) -> str:
        if not _UPSTREAM_NAME.fullmatch(value):
            raise ValueError("must be the provider's model name: 1 to 256 characters, no spaces or quotes")
        return value

    @field_validator("key")
    @classmethod
    def _key(cls, value: str) -> str:
        if any(ch in value for ch in "\r\n\0"):
            raise ValueError("must be one line (a key file's trailing newline is removed when it is read)")
        return value.strip()

    @property
    def secure(self) -> bool:
        """Whether the provider is called over TLS."""
        return self.base_url.startswith("https://")

    @property
    def root(self) -> str:
        """Scheme, host and port: where the gateway connects."""
        parts = urlsplit(self.base_url)
        port = parts.port or (443 if self.secure else 80)
        host = f"[{parts.hostname}]" if ":" in (parts.hostname or "") else parts.hostname
        return f"{parts.scheme}://{host}:{port}"

    @property
    def path_prefix(self) -> str:
        """What goes before a ``/v1/...`` route: the base URL's path without a last ``/v1``."""
        path = urlsplit(self.base_url).path.rstrip("/")
        return path.removesuffix("/v1")


def shown_key(provider: Provider) -> Provider:
    """``provider`` as /api, ctl and the audit log show it: its key ``set`` (or empty), never itself."""
    return provider.model_copy(update={"key": KEY_SET if provider.key else ""})


def shown_definition(definition: dict[str, Any]) -> dict[str, Any]:
    """A dumped model definition with its provider key shown as :func:`shown_key` shows it."""
    section = definition.get("provider")
    if not isinstance(section, dict) or not section.get("key"):
        return definition
    return {**definition, "provider": {**section, "key": KEY_SET}}


class ProviderFields(BaseModel):
    """The ``provider`` field of a model definition, and what a provider model may not have."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    provider: Provider | None = None
    """Served by this endpoint outside the cluster (:mod:`llmgw.core.providers`), not by replicas."""

    @field_validator("source", check_fields=False)
    @classmethod
    def _source_unless_provider(cls, value: Any, info: ValidationInfo) -> Any:
        if value is None and info.data.get("provider") is None:
            raise PydanticCustomError("missing", "Field required")  # the weights the cluster runs
        return value

    @model_validator(mode="after")
    def _provider_is_not_placed(self) -> Any:
        if self.provider is None:
            return self
        given = [name for name in PLACED_ONLY if not _default(name, getattr(self, name, None))]
        if given:
            raise ValueError(
                f"a provider model is served by its provider, not placed on the cluster: remove "
                f"{', '.join(given)}"
            )
        return self


def _default(name: str, value: Any) -> bool:
    """Whether a placed model's field holds what a definition without it gets."""
    if name == "profiles":
        return len(value) == 1 and value[0] == type(value[0])()
    if name == "replicas":
        return bool(value == type(value)())
    return not value


def served_outside(model: ProviderFields) -> str:
    """A short line naming where a provider model is served (``openai gpt-4o at api.openai.com``)."""
    provider = model.provider
    if provider is None:
        return ""
    return f"{provider.api.value} {provider.model} at {urlsplit(provider.base_url).netloc}"
