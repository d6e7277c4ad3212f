"""server.yaml: a control plane's configuration, grouped by concern."""

from __future__ import annotations

import os
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from llmgw.core.catalog import problems_of
from llmgw.errors import ConfigError


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StoreSettings(Section):
    url: str = ""
    """SQLAlchemy URL of the store; empty: SQLite at ``<data_dir>/llmgw.db``."""
    timeout_s: float = 5.0
    """Every store call gives up after this long, so no request hangs on the store."""


class HttpSettings(Section):
    host: str = "127.0.0.1"
    """Address the gateway (/v1), admin API (/api) and /metrics listen on."""
    port: int = Field(default=8080, ge=0, le=65535)


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


class LeadershipSettings(Section):
    lease_s: float = Field(default=10.0, gt=0.5)
    """Length of the leader lease on the database's clock; renewed every third of it."""
    vip: str = ""
    """Floating address keepalived keeps on the leader (``server add --vip``); empty: none."""


class GatewaySettingsFile(Section):
    request_wait_s: float = 60.0
    """How long a request waits for a replica to become ready before a 503."""
    upstream_timeout_s: float = 600.0
    """How long a request may take on its engine."""


class ServerConfig(Section):
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

    # Where the file was read from; not part of the file.
    _directory: Path = Path(".")

    def path(self, value: str) -> Path:
        """A path from the config, relative ones taken from the config's directory."""
        p = Path(value).expanduser()
        return p if p.is_absolute() else self._directory / p

    @property
    def data_path(self) -> Path:
        return self.path(self.data_dir)

    @property
    def store_url(self) -> str:
        return self.store.url or f"sqlite+aiosqlite:///{self.data_path / 'llmgw.db'}"

    @property
    def directory(self) -> Path:
        return self._directory


def load_server_config(path: Path) -> ServerConfig:
    """Read server.yaml, naming the file and each bad field when it cannot be used."""
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        raise ConfigError(f"no configuration at {path}", "create one with 'llmgw server init'") from None
    except (OSError, yaml.YAMLError) as error:
        raise ConfigError(f"cannot read {path}: {error}", "fix the file or create it again") from None
    try:
        config = ServerConfig.model_validate(data)
    except ValidationError as error:
        text = "; ".join(f"{field}: {why}" for field, why in problems_of(error))
        raise ConfigError(f"{path}: {text}", "fix the fields named") from None
    config._directory = path.parent.resolve()
    return config


def save_server_config(config: ServerConfig, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
    os.replace(temporary, path)
    config._directory = path.parent.resolve()
