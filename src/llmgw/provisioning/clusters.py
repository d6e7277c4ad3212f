"""A cluster's files on this machine: a new cluster, another control plane, a node's certificate.

:func:`initialise` is ``llmgw server init`` (the CA, this control plane's
certificate, the admin token, server.yaml and the store);
:func:`add_control_plane` writes another control plane's files beside the
cluster's (``server add --dir``, and what ``server add HOST`` copies over
SSH); :func:`issue_node_certificate` is a node's client-only certificate,
never under a control plane's name; :func:`set_up_node` makes this machine a
node (``llmgw up``, the console's setup). :func:`describe_pull` and
:func:`certificate_warning` say what a new control plane will pull from its
peers and why their mirrors would refuse a certificate. Each raises
:class:`~llmgw.errors.ConfigError` saying what to do instead of overwriting.
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import socket
from pathlib import Path

from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from llmgw.agent.config import AgentConfig, save_agent_config
from llmgw.client.paths import engine_cache
from llmgw.controlplane.config import (
    AgentServerSettings,
    HttpSettings,
    ServerConfig,
    StoreSettings,
    TlsSettings,
    save_server_config,
)
from llmgw.errors import ConfigError, LlmgwError
from llmgw.pki.authority import Authority
from llmgw.protocol.grpc_transport import SERVER_NAME
from llmgw.provisioning.keepalived import keepalived_config
from llmgw.runtime.files import write_private, write_public
from llmgw.store.secretbox import KEY_FILE as STORE_KEY_FILE
from llmgw.store.secretbox import load_or_create

ADMIN_TOKEN_FILE = "admin.token"


def initialise(
    directory: Path,
    *,
    name: str,
    http_host: str,
    http_port: int,
    agent_host: str,
    agent_port: int,
    store_url: str = "",
) -> ServerConfig:
    """A new cluster in ``directory``: CA, this control plane's certificate, admin token, store key,
    config, store."""
    path = directory / "server.yaml"
    if path.exists():
        raise ConfigError(f"{path} already exists", "use it with 'llmgw server run', or choose another --dir")
    directory.mkdir(parents=True, exist_ok=True)
    authority = Authority.create(directory)
    hosts = sorted(
        {SERVER_NAME, "localhost", "127.0.0.1", socket.gethostname(), http_host, agent_host} - {"0.0.0.0", ""}
    )
    authority.issue(name, sans=hosts, usage="both", directory=directory, stem="server")
    token = "llmgw-admin-" + secrets.token_urlsafe(32)
    write_private(directory / ADMIN_TOKEN_FILE, (token + "\n").encode())
    load_or_create(directory / STORE_KEY_FILE)
    config = ServerConfig(
        name=name,
        admin_token_sha256=hashlib.sha256(token.encode()).hexdigest(),
        store=StoreSettings(url=store_url),
        http=HttpSettings(host=http_host, port=http_port),
        agent_server=AgentServerSettings(host=agent_host, port=agent_port),
    )
    save_server_config(config, path)
    from llmgw.store.database import Store

    async def create_store() -> None:
        store = await Store.open(config.store_url, timeout_s=config.store.timeout_s)
        await store.close()

    asyncio.run(create_store())
    return config


def add_control_plane(
    config: ServerConfig,
    directory: Path,
    *,
    name: str,
    http_host: str,
    http_port: int,
    agent_host: str,
    agent_port: int,
    vip: str = "",
    interface: str = "eth0",
) -> ServerConfig:
    """Another control plane of the cluster ``config`` belongs to, in ``directory``.

    It gets its own certificate (server and client use: standbys relay to the
    leader with it), the CA, the admin token, the store key and the same store; ``vip`` adds a
    keepalived configuration that keeps the floating address on the leader.
    """
    if config.store_url.startswith("sqlite"):
        raise ConfigError(
            f"the cluster's store is SQLite ({config.store_url}), which one machine alone can use",
            hint="move the store to PostgreSQL (store.url in server.yaml) before adding a control plane",
        )
    if name == config.name:
        raise ConfigError(f"control plane {name!r} exists already", hint="give the new one another --name")
    path = directory / "server.yaml"
    if path.exists():
        raise ConfigError(f"{path} already exists", "choose another --dir, or run it as it is")
    keepalived = keepalived_config(vip, f"{http_host}:{http_port}", interface) if vip else ""
    directory.mkdir(parents=True, exist_ok=True)
    source = config.path(config.tls.ca).parent
    authority = Authority.load(source)
    hosts = sorted(
        {SERVER_NAME, "localhost", "127.0.0.1", http_host, agent_host, *([vip.split("/")[0]] if vip else [])}
        - {"0.0.0.0", ""}
    )
    authority.issue(name, sans=hosts, usage="both", directory=directory, stem="server")
    write_public(directory / Path(config.tls.ca).name, config.path(config.tls.ca).read_bytes())
    write_private(directory / Path(config.tls.ca_key).name, config.path(config.tls.ca_key).read_bytes())
    token = config.directory / ADMIN_TOKEN_FILE
    if token.exists():
        write_private(directory / ADMIN_TOKEN_FILE, token.read_bytes())
    store_key = config.path(config.store.secrets_key)
    load_or_create(store_key)  # made here where the cluster has none yet, so both planes share one
    write_private(directory / STORE_KEY_FILE, store_key.read_bytes())
    added = config.model_copy(deep=True)
    added.name = name
    added.data_dir = "."
    # the cluster's own limits and timeouts carry over; only where this one listens differs
    added.http = config.http.model_copy(update={"host": http_host, "port": http_port})
    added.agent_server = config.agent_server.model_copy(update={"host": agent_host, "port": agent_port})
    added.tls = TlsSettings(ca=Path(config.tls.ca).name, ca_key=Path(config.tls.ca_key).name)
    added.store.secrets_key = STORE_KEY_FILE
    if vip:
        added.leadership.vip = vip
        write_private(directory / "keepalived.conf", keepalived.encode())
    save_server_config(added, path)
    return added


def issue_node_certificate(config: ServerConfig, node_id: str, out: Path) -> None:
    """A node's client-only certificate; never under a control plane's name."""
    planes = {config.name, *asyncio.run(_control_plane_names(config))}
    if node_id in planes:
        raise ConfigError(
            f"{node_id!r} is the name of a control plane of this cluster, not a node",
            hint="give the node a name of its own (its hostname, say)",
        )
    authority = Authority.load(config.path(config.tls.ca).parent)
    out.mkdir(parents=True, exist_ok=True)
    authority.issue(node_id, sans=[node_id], usage="client", directory=out, stem="node")
    write_public(out / "ca.crt", config.path(config.tls.ca).read_bytes())


async def _control_plane_names(config: ServerConfig) -> list[str]:
    from llmgw.store.database import Store
    from llmgw.store.leases import Leases

    store = await Store.open(config.store_url, timeout_s=config.store.timeout_s)
    try:
        return [plane.name for plane in await Leases(store).control_planes()]
    finally:
        await store.close()


def set_up_node(config: ServerConfig, agent_yaml: Path, node_id: str) -> None:
    """This machine as a node of the cluster ``config`` makes: its certificate and ``agent_yaml``."""
    issue_node_certificate(config, node_id, agent_yaml.parent)
    save_agent_config(
        AgentConfig(
            node_id=node_id,
            control_planes=[f"127.0.0.1:{config.agent_server.port}"],
            cache_dir=str(engine_cache()),
        ),
        agent_yaml,
    )


def pull_estimate(store_url: str, timeout_s: float = 5.0) -> tuple[int, int]:
    """(blobs, bytes) a new control plane pulls from its peers: every blob the store lists (each plane
    keeps the whole mirror)."""
    from llmgw.store.database import Store

    async def read() -> tuple[int, int]:
        store = await Store.open(store_url, timeout_s=timeout_s)
        try:
            blobs = await store.blobs.list()
        finally:
            await store.close()
        return len(blobs), sum(b.size for b in blobs)

    return asyncio.run(read())


def describe_pull(store_url: str, timeout_s: float = 5.0) -> str:
    """What ``server add`` says the new control plane will pull, or why it cannot say."""
    try:
        count, size = pull_estimate(store_url, timeout_s)
    except LlmgwError as error:
        return f"cannot tell what it will pull from its peers yet: {error}"
    if not count:
        return "the mirror is empty: it has nothing to pull"
    return (
        f"it will pull {count} blobs ({size} bytes, {size / (1 << 30):.1f} GiB) from its peers once it runs "
        "('llmgw mirror list' shows the copies)"
    )


def certificate_warning(name: str, cert: Path) -> str:
    """Why a control plane's mirror would refuse the peer with certificate ``cert``, or "" when none.

    A plane pulls from its peers with its own certificate as a TLS client and serves them as a
    server, so it needs both uses; certificates of older clusters had server use alone.
    """
    try:
        certificate = x509.load_pem_x509_certificate(cert.read_bytes())
        usages = set(certificate.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value)
    except (OSError, ValueError, x509.ExtensionNotFound):
        usages = set()
    missing = [
        words
        for oid, words in (
            (ExtendedKeyUsageOID.SERVER_AUTH, "server"),
            (ExtendedKeyUsageOID.CLIENT_AUTH, "client"),
        )
        if oid not in usages
    ]
    if not missing:
        return ""
    return (
        f"the certificate of {name} ({cert}) lacks {' and '.join(missing)} use: the control planes' "
        "mirrors would refuse it, and it would neither pull blobs from its peers nor serve them; "
        f"issue it again with both uses ('llmgw server add' writes such a certificate for a new plane)"
    )
