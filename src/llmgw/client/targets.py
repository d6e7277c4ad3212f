"""Which control plane a command talks to, and with which admin token.

In order: ``--url``/``--token``; then ``$LLMGW_URL``/``$LLMGW_ADMIN_TOKEN``;
then the client config's current context (:mod:`llmgw.client.config`);
then the control plane on this machine (``llmgw up``'s or /etc/llmgw's
server.yaml, with admin.token beside it; only its ``http`` section is read
here, so the client does not load the server's configuration). A context lends its token only to
its own URL: a URL given another way never gets a context's token.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from pydantic import ConfigDict, Field

from llmgw.client.config import load_client_config
from llmgw.client.paths import client_config_path, find_server_config
from llmgw.configfiles import ConfigFile, Section, read_yaml, validate
from llmgw.errors import ConfigError


@dataclass(frozen=True)
class Target:
    url: str
    token: str
    source: str
    """Where they came from, for messages: ``flags or environment``, ``context NAME``, or a server.yaml."""


def resolve_target(
    url: str | None = None,
    token: str | None = None,
    *,
    environ: Mapping[str, str] = os.environ,
    server_config: Path | None = None,
) -> Target:
    """The control plane to talk to (see the module's docstring for the order)."""
    url = url or environ.get("LLMGW_URL") or None
    token = token or environ.get("LLMGW_ADMIN_TOKEN") or None
    if url and token:
        return Target(url, token, "flags or environment")
    config = load_client_config(client_config_path(environ))
    context = config.current()
    if context is not None and (url is None or _same(url, context.url)):
        return Target(url or context.url, token or config.token_of(context), f"context {context.name}")
    return _local(url, token, server_config or find_server_config(environ))


class Listening(Section):
    """Where a control plane serves ``/api``: server.yaml's ``http`` section (its other fields: the server's).

    The defaults are the server's (:class:`llmgw.controlplane.config.HttpSettings`)."""

    model_config = ConfigDict(extra="ignore")

    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)


class ServerAddress(ConfigFile):
    """The part of a server.yaml a client reads."""

    model_config = ConfigDict(extra="ignore")

    http: Listening = Listening()


def read_server_address(path: Path) -> Listening:
    """server.yaml's ``http`` section, naming the file and each bad field when it cannot be used."""
    data = read_yaml(path, "create one with 'llmgw server init'")
    return validate(ServerAddress, data, str(path)).http


def _same(a: str, b: str) -> bool:
    return a.rstrip("/") == b.rstrip("/")


def _local(url: str | None, token: str | None, path: Path | None) -> Target:
    """The control plane whose server.yaml is on this machine."""
    if path is None:
        raise ConfigError(
            "no control plane to talk to",
            "pass --url and --token, set LLMGW_URL and LLMGW_ADMIN_TOKEN, add a context with "
            "'llmgw ctl context set NAME --url URL --token-file FILE', or run 'llmgw up'",
        )
    http = read_server_address(path)
    host = "127.0.0.1" if http.host in ("0.0.0.0", "") else http.host
    if not token:
        try:
            token = (path.parent / "admin.token").read_text().strip()
        except OSError as error:
            raise ConfigError(
                f"cannot read the admin token beside {path}: {error.strerror}",
                "set LLMGW_ADMIN_TOKEN or run as a user who can read it",
            ) from None
    return Target(url or f"http://{host}:{http.port}", token, str(path))
