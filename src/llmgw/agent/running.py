"""Wiring of one agent process: its parts built once each in order, its long-lived work supervised.

::

    discovery -> links to the control planes -> installer -> shards (engines)
              -> session -> KV reporter -> telemetry

Every long-lived task is a component of one process supervisor
(:mod:`llmgw.runtime.supervising`), restarted with backoff when it fails, its
failure logged with the traceback and kept in the supervisor's health list:

================  ========  ==============================================
component         policy    what
================  ========  ==============================================
``session``       RESTART   the stream to the leading control plane
``kv-events``     RESTART   vLLM shards' KV events up the stream
``weights-gc``    RESTART   unused weights removed past their keep time, when too many
``config-watch``  RESTART   agent.yaml edited: start again (when asked)
``telemetry``     RESTART   the cards' telemetry (on a node with cards)
``metrics``       RESTART   ``/metrics`` on ``metrics.host:port`` (unless port 0)
``firewall``      RESTART   llmgw's nftables table: engines' ports from control planes only
================  ========  ==============================================

A FATAL component's failure ends :func:`run_agent` with
:class:`~llmgw.runtime.supervising.ComponentFailed`, which the CLI turns into
exit code 1.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from llmgw.agent.blobsources import BlobSources
from llmgw.agent.config import AgentConfig, kept_settings, load_agent_config
from llmgw.agent.discovery import choose_source, discover
from llmgw.agent.engineuser import engine_user
from llmgw.agent.fetchprogress import FetchMeters
from llmgw.agent.gpus import GpuSource
from llmgw.agent.installing import Installer
from llmgw.agent.kv_reporting import KvReporter
from llmgw.agent.launching import SubprocessLauncher
from llmgw.agent.metrics import publishing_gpus, serve_metrics
from llmgw.agent.nvidia_smi import NvidiaSmi
from llmgw.agent.restarting import Restarting, command_line, start_again
from llmgw.agent.session import AgentSession
from llmgw.agent.settingstrial import SettingsTrial
from llmgw.agent.starttracing import ShardStartTraces
from llmgw.agent.supervising import ShardSupervisor
from llmgw.agent.telemetry import Sampler, descendants
from llmgw.agent.training import TrainingJobs
from llmgw.agent.trainingprep import TrainingPreparer
from llmgw.agent.upgrading import AgentUpgrader
from llmgw.agent.weights_collecting import WeightsCollector
from llmgw.core.agentstream import AgentMessage
from llmgw.core.devices import NodeInventory
from llmgw.core.shards import FetchProgress
from llmgw.mirror.upgrades import PipInstaller
from llmgw.observability import logcontext
from llmgw.observability.tracing import Tracing
from llmgw.operations.firewallkeeping import FirewallKeeper, agent_source
from llmgw.operations.nftables import FirewallState, Nft
from llmgw.protocol.channels import AgentChannel
from llmgw.protocol.grpc_client import GrpcConnector, KeptChannels
from llmgw.protocol.grpc_transport import TlsFiles
from llmgw.runtime import supervising
from llmgw.runtime.processes import Process, run_process

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 3.0
"""How long to wait for one control plane's TLS channel before trying the next."""


class ControlPlaneLinks:
    """The agent's TLS links: its stream to a control plane, and blob fetches from any of them."""

    def __init__(self, tls: TlsFiles, control_planes: list[str]) -> None:
        self._tls = tls
        self._control_planes = control_planes
        self._kept = KeptChannels(tls)
        """One TLS channel per control plane, kept between streams: asking a standby again is no handshake."""
        self.current = ""
        """The control plane the last stream was opened to ("" before any)."""

    async def connect(self, target: str) -> AgentChannel:
        channel = await self._kept.connect(target, timeout_s=CONNECT_TIMEOUT_S)
        self.current = target
        return channel

    async def close(self) -> None:
        """Close the kept channels (the agent stops)."""
        await self._kept.close()

    def fetch_from(self, target: str, sha256: str, offset: int) -> AsyncIterator[bytes]:
        """A blob's bytes from the control plane at ``target`` (any of them: each keeps the mirror)."""
        return GrpcConnector(target, self._tls).fetch(sha256, offset)


class Uplink:
    """What the agent's parts send towards the control plane (messages; a starting shard's fetch
    progress) and the control planes the session knows, handed to the session and the shards once
    the session runs (the ``session`` component).

    The parts that send are built before the session, which carries out their commands, and
    before the shards, which run the installer that reports progress: they are handed this instead.
    Until the session first runs, messages are dropped (as the session drops them while not
    connected) and the planes known are agent.yaml's; from then on each goes to the session and
    the shards, as if sent to them directly (between two runs of the session too)."""

    def __init__(self, control_planes: Sequence[str]) -> None:
        self._planes = list(control_planes)
        self._session: AgentSession | None = None
        self._shards: ShardSupervisor | None = None

    def send(self, message: AgentMessage) -> None:
        if self._session is not None:
            self._session.send(message)

    def fetching(self, replica_id: str, progress: FetchProgress) -> None:
        if self._shards is not None:
            self._shards.fetching(replica_id, progress)

    def control_planes(self) -> list[str]:
        return self._session.control_planes if self._session is not None else self._planes

    def register_again(self) -> None:
        if self._session is not None:
            self._session.register_again()

    async def run(self, session: AgentSession, shards: ShardSupervisor) -> None:
        """Hand ``session`` and ``shards`` what the other parts send, and run the session until
        cancelled."""
        self._session, self._shards = session, shards
        await session.run()


@dataclass(frozen=True)
class AgentParts:
    """Every part of one agent, built once each by :func:`build_agent`."""

    config: AgentConfig
    gpus: GpuSource
    inventory: NodeInventory
    links: ControlPlaneLinks
    uplink: Uplink
    tracing: Tracing
    installer: Installer
    shards: ShardSupervisor
    training: TrainingJobs
    upgrader: AgentUpgrader
    kv_reporter: KvReporter
    session: AgentSession
    weights: WeightsCollector
    restarting: Restarting | None
    """Starts the agent again when asked (None: it only stops)."""
    trial: SettingsTrial | None
    """The settings on trial, good once the agent registers; its refusal goes in each registration."""
    keep_engines: bool
    """Stopped, leave the engines running for the next agent to adopt (systemd's restart of the
    unit) instead of stopping them."""


async def _node(config: AgentConfig) -> tuple[GpuSource, NodeInventory]:
    logcontext.NODE.set(config.node_id)  # every log line of this agent names its node
    gpus = choose_source(config.nvidia_smi)
    inventory = await discover(config.node_id, config.address, gpus_from=gpus)
    log.info(
        "node %s: %d cores, %d MiB, %d cards",
        inventory.node_id,
        inventory.cpu_cores,
        inventory.memory_mb,
        len(inventory.gpus),
    )
    return gpus, inventory


def _shards(
    config: AgentConfig,
    gpus: GpuSource,
    inventory: NodeInventory,
    installer: Installer,
    traces: ShardStartTraces,
) -> ShardSupervisor:
    config.work_path.mkdir(parents=True, exist_ok=True)
    return ShardSupervisor(
        config.work_path,
        config.shards,
        installer.prepare,
        ports=(config.ports.first, config.ports.last),
        host=config.address,
        device_uuids={device.index: device.uuid for device in inventory.gpus},
        gpus=gpus if inventory.gpus else None,
        engine_user=engine_user(config.run_as, config.work_path),
        launcher=traces.launcher(SubprocessLauncher()),
        traced=traces.emitted,
    )


def _training(
    config: AgentConfig, inventory: NodeInventory, installer: Installer, uplink: Uplink
) -> TrainingJobs:
    preparer = TrainingPreparer(
        config.cache_path,
        installer.weights_dir,
        installer.blob,
        installer.engine,
        pypi_url=config.engines.llamacpp.pypi_url,
    )
    return TrainingJobs(
        inventory.node_id,
        config.work_path,
        preparer,
        uplink.send,
        engine_user=engine_user(config.run_as, config.work_path),
        device_uuids={device.index: device.uuid for device in inventory.gpus},
    )


def _session(
    config: AgentConfig,
    parts: tuple[NodeInventory, ShardSupervisor, ControlPlaneLinks, Installer],
    handlers: tuple[AgentUpgrader, TrainingJobs, KvReporter],
    restarting: Restarting | None,
    trial: SettingsTrial | None,
) -> AgentSession:
    inventory, shards, links, installer = parts
    upgrader, training, kv_reporter = handlers
    return AgentSession(
        inventory,
        shards,
        config.control_planes,
        links.connect,
        engines=installer.installed_engines,
        on_settings=restarting.on_settings if restarting else None,
        on_restart=restarting.request if restarting else None,
        refusal=trial.refusal if trial else lambda: None,
        on_registered=trial.on_registered if trial else lambda: None,
        on_upgrade=upgrader.handle,
        on_builds=installer.mirror.use,
        on_training=training.handle,
        on_stream=partial(_resend, kv_reporter, training),
    )


def _resend(kv_reporter: KvReporter, training: TrainingJobs) -> None:
    """What the control plane may have missed while the stream was down."""
    kv_reporter.resend()
    training.resend()


async def build_agent(
    config: AgentConfig,
    process: Process,
    *,
    config_path: Path | None = None,
    trial: SettingsTrial | None = None,
    keep_engines: bool = False,
) -> AgentParts:
    """Every part in order; ``config_path``: the agent.yaml it starts again on when asked (None:
    it only stops)."""
    gpus, inventory = await _node(config)
    tls = TlsFiles(config.path(config.tls.ca), config.path(config.tls.cert), config.path(config.tls.key))
    tls.read()
    links = ControlPlaneLinks(tls, config.control_planes)
    process.closing.push_async_callback(links.close)
    uplink = Uplink(config.control_planes)
    tracing = Tracing.from_settings(config.tracing, f"llmgw-agent {inventory.node_id}")
    process.closing.callback(tracing.shutdown)
    traces = ShardStartTraces(tracing)
    # the leader first (the plane reached last), then every plane the session knows
    sources = BlobSources(lambda: links.current, uplink.control_planes, links.fetch_from)
    installer = Installer(config, lambda: inventory, sources.fetcher, traces, FetchMeters(uplink.fetching))
    shards = _shards(config, gpus, inventory, installer, traces)
    stop = process.stop
    restarting = (
        Restarting(config_path, lambda reason: stop.set(), trial, on_withdrawn=uplink.register_again)
        if config_path is not None
        else None
    )
    training = _training(config, inventory, installer, uplink)
    restart = restarting.request if restarting else lambda reason: stop.set()
    pub = config.path(config.release.trusted_pub)
    upgrader = AgentUpgrader(config.work_path, pub, sources.fetcher, PipInstaller(), restart, uplink.send)
    kv_reporter = KvReporter(shards.shards, uplink.send)
    handlers = (upgrader, training, kv_reporter)
    session = _session(config, (inventory, shards, links, installer), handlers, restarting, trial)
    weights = WeightsCollector(
        installer.weights_dir,
        lambda: [shard.spec for shard in shards.shards.values()],
        installer.weights_lock,
        keep_hours=config.weights_keep_hours,
        max_gb=config.weights_max_gb,
    )
    parts = AgentParts(
        config, gpus, inventory, links, uplink, tracing, installer, shards, training, upgrader, kv_reporter,
        session, weights, restarting, trial, keep_engines,
    )  # fmt: skip
    process.closing.push_async_callback(_stopped, parts, process.supervisor)
    return parts


async def serve_agent(parts: AgentParts, process: Process) -> None:
    """Run the components (the table above) until stopped."""
    config, supervisor, session = parts.config, process.supervisor, parts.session
    parts.shards.adopt()  # the engines a previous agent left running
    supervisor.add("session", lambda: parts.uplink.run(session, parts.shards))
    supervisor.add("kv-events", parts.kv_reporter.run)
    supervisor.add("weights-gc", parts.weights.run)
    if parts.restarting is not None:
        supervisor.add("config-watch", parts.restarting.watch_file)
    if parts.inventory.gpus:
        supervisor.add("telemetry", lambda: sample_cards(parts.gpus, config, parts.uplink, parts.shards))
    if config.metrics.port:
        supervisor.add("metrics", lambda: serve_metrics(config.metrics.host, config.metrics.port))
    firewall = agent_source(
        config.node_id,
        config.firewall.enabled,
        config.address,
        (config.ports.first, config.ports.last),
        parts.uplink.control_planes,
    )
    supervisor.add("firewall", FirewallKeeper(firewall, FirewallState(), Nft()).run)
    await process.stop.wait()


async def _stopped(parts: AgentParts, supervisor: supervising.Supervisor) -> None:
    """Once the components stopped: start again (engines serving) when asked, else stop the engines
    (unless kept) and the training jobs."""
    failed = [h for h in supervisor.health() if h.restarts]
    if failed:
        log.warning(
            "components that failed while the agent ran: %s",
            "; ".join(f"{h.name} ({h.restarts} restarts, last: {h.last_error})" for h in failed),
        )
    if parts.restarting is not None and parts.restarting.reason:
        if parts.trial is not None:
            parts.trial.stopped()
        await parts.links.close()
        parts.tracing.shutdown()
        start_again(command_line())  # never returns: the engines stay, the next agent adopts them
    if parts.keep_engines:
        log.info(
            "stopping with the engines of %d shards left running for the next agent", len(parts.shards.shards)
        )
    else:
        await parts.shards.stop_all()
    await parts.training.stop_all()


async def run_agent(
    config: AgentConfig,
    process: Process | None = None,
    *,
    config_path: Path | None = None,
    trial: SettingsTrial | None = None,
    keep_engines: bool = False,
) -> None:
    """Run until a stop signal (or ``process.stop``); when asked, start this same command again
    (``config_path``), engines serving."""
    await run_process(
        lambda process: build_agent(
            config, process, config_path=config_path, trial=trial, keep_engines=keep_engines
        ),
        serve_agent,
        process,
    )


async def sample_cards(gpus: GpuSource, config: AgentConfig, uplink: Uplink, shards: ShardSupervisor) -> None:
    """Send the cards' telemetry to the control plane; nvidia-smi's full report every minute."""
    full = NvidiaSmi(config.nvidia_smi) if not isinstance(gpus, NvidiaSmi) else None
    sampler = Sampler(gpus, lambda: descendants(os.getpid()) | shards.engine_pids(), full_report=full)
    await sampler.run(publishing_gpus(config.node_id, uplink.send))


async def run_until_signalled(config_path: Path, keep_engines: bool = False) -> None:
    """Run the agent of ``config_path`` until a stop signal; it starts itself again when asked.

    New settings from the control plane are on trial (:mod:`llmgw.agent.settingstrial`): an agent
    that fails to start on them goes back to the last good ones and starts again on those.
    """
    trial = SettingsTrial(config_path)
    trial.begin()
    try:
        config = load_agent_config(config_path)
        kept = kept_settings(config_path)
        if kept:
            log.info("running with the control plane's settings: %s", json.dumps(kept, sort_keys=True))
        await run_agent(config, config_path=config_path, trial=trial, keep_engines=keep_engines)
    except Exception as error:
        if trial.fail(error) is not None:
            start_again(command_line())  # on the last good settings; never returns
        raise
    finally:
        trial.stopped()
