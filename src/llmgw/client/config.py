"""The client config of ``ctl``: named contexts (a control plane's URL and token), as kubeconfig has them.

::

    current-context: prod
    contexts:
      - name: prod
        url: https://llmgw.example.com:8080
        token-file: ~/.config/llmgw/prod.token
      - name: lab
        url: http://10.0.0.5:8080
        token: llmgw-admin-...

It lives at ``$LLMGW_CLIENT_CONFIG`` or ``$XDG_CONFIG_HOME/llmgw/config.yaml``
(``~/.config/llmgw/config.yaml``), written 0600 since it may hold tokens.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import ConfigDict, Field, model_validator

from llmgw.configfiles import ConfigFile, Section, read_yaml, validate
from llmgw.errors import ConfigError, NotFound
from llmgw.runtime.files import write_private


class Context(Section):
    """One control plane to talk to."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str = Field(min_length=1)
    url: str = Field(min_length=1)
    """The control plane's HTTP address, e.g. ``http://10.0.0.5:8080``."""
    token: str = ""
    """The admin token itself."""
    token_file: str = Field(default="", alias="token-file")
    """A file holding the admin token (relative paths from the config's directory)."""

    @model_validator(mode="after")
    def _one_token(self) -> Context:
        if self.token and self.token_file:
            raise ValueError("give token or token-file, not both")
        return self


class ClientConfig(ConfigFile):
    """Every context, and which one ``ctl`` uses when not told."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    current_context: str = Field(default="", alias="current-context")
    contexts: list[Context] = []

    def find(self, name: str) -> Context | None:
        return next((c for c in self.contexts if c.name == name), None)

    def current(self) -> Context | None:
        """The current context; ConfigError when it names none that exists."""
        if not self.current_context:
            return None
        found = self.find(self.current_context)
        if found is None:
            raise ConfigError(
                f"the current context {self.current_context!r} is not among the contexts",
                "choose one with 'llmgw ctl context use NAME' or add it with 'llmgw ctl context set'",
            )
        return found

    def put(self, context: Context) -> None:
        """Add ``context``, or replace the one of its name."""
        self.contexts = [c for c in self.contexts if c.name != context.name] + [context]

    def remove(self, name: str) -> None:
        if self.find(name) is None:
            raise NotFound(f"no context {name!r}", "list them with 'llmgw ctl context list'")
        self.contexts = [c for c in self.contexts if c.name != name]
        if self.current_context == name:
            self.current_context = ""

    def token_of(self, context: Context) -> str:
        """The context's admin token, read from its token file if it names one."""
        if not context.token_file:
            if not context.token:
                raise ConfigError(
                    f"context {context.name!r} has no token",
                    f"give it one: 'llmgw ctl context set {context.name} --token-file PATH'",
                )
            return context.token
        path = self.path(context.token_file)
        try:
            token = path.read_text().strip()
        except OSError as error:
            raise ConfigError(
                f"cannot read the token file of context {context.name!r}, {path}: {error.strerror}",
                "fix token-file in the client config, or run as a user who can read it",
            ) from None
        if not token:
            raise ConfigError(f"the token file {path} is empty", "write the admin token into it")
        return token


def load_client_config(path: Path) -> ClientConfig:
    """The client config at ``path`` (empty when there is no file)."""
    if not path.exists():
        config = ClientConfig()
        config._directory = path.parent.resolve()
        return config
    data = read_yaml(path, "")
    return validate(ClientConfig, data, str(path), path.parent)


def save_client_config(config: ClientConfig, path: Path) -> None:
    """Write the client config to ``path``, 0600 (it may hold tokens), atomically."""
    data = config.model_dump(mode="json", by_alias=True, exclude_defaults=True)
    data.setdefault("contexts", [])
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    write_private(path, yaml.safe_dump(data, sort_keys=False).encode())
    config._directory = path.parent.resolve()
