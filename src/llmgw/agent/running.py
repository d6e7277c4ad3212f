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

import asyncio
import json
import logging
import os
import signal
from collections.abc import AsyncIterator
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
from llmgw.agent.supervising import Supervisor
from llmgw.agent.telemetry import Sampler, descendants
from llmgw.agent.training import TrainingJobs
from llmgw.agent.trainingprep import TrainingPreparer
from llmgw.agent.upgrading import AgentUpgrader
from llmgw.agent.weights_collecting import WeightsCollector
from llmgw.mirror.upgrades import PipInstaller
from llmgw.observability import logcontext
from llmgw.observability.tracing import Tracing
from llmgw.operations.firewallkeeping import FirewallKeeper, agent_source
from llmgw.operations.nftables import FirewallState, Nft
from llmgw.protocol.channels import AgentChannel
from llmgw.protocol.grpc_client import GrpcConnector, KeptChannels
from llmgw.protocol.grpc_transport import TlsFiles
from llmgw.runtime import supervising

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


async def run_agent(
    config: AgentConfig,
    stop: asyncio.Event,
    restarting: Restarting | None = None,
    components: supervising.Supervisor | None = None,
    trial: SettingsTrial | None = None,
    keep_engines: bool = False,
) -> None:
    """Run until ``stop``; when ``restarting`` asks, start this same command again, engines serving.

    ``keep_engines``: stopped, leave the engines running for the next agent to adopt (systemd's
    restart of the unit) instead of stopping them.

    ``components``: the process supervisor (its :meth:`health` is the agent's components' state).
    ``trial``: the settings on trial, good once the agent registers; its refusal goes in each registration.
    """
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
    tls = TlsFiles(config.path(config.tls.ca), config.path(config.tls.cert), config.path(config.tls.key))
    tls.read()
    links = ControlPlaneLinks(tls, config.control_planes)
    tracing = Tracing.from_settings(config.tracing, f"llmgw-agent {inventory.node_id}")
    traces = ShardStartTraces(tracing)
    # the leader first (the plane reached last), then every plane the session knows
    sources = BlobSources(lambda: links.current, lambda: session.control_planes, links.fetch_from)
    meters = FetchMeters(lambda replica_id, progress: shards.fetching(replica_id, progress))
    installer = Installer(config, lambda: inventory, sources.fetcher, traces, meters)
    config.work_path.mkdir(parents=True, exist_ok=True)
    shards = Supervisor(
        config.work_path,
        config.shards,
        installer.prepare,
        ports=(config.ports.first, config.ports.last),
        host=config.address,
        device_uuids={device.index: device.uuid for device in inventory.gpus},
        gpus=gpus if inventory.gpus else None,
        engine_user=engine_user(config.run_as, config.work_path),
        launcher=traces.launcher(SubprocessLauncher()),
    )
    shards.traced = traces.emitted
    shards.adopt()
    session = AgentSession(
        inventory,
        shards,
        config.control_planes,
        links.connect,
        engines=installer.installed_engines,
        on_settings=restarting.on_settings if restarting else None,
        on_restart=restarting.request if restarting else None,
        refusal=trial.refusal if trial else lambda: None,
        on_registered=trial.on_registered if trial else lambda: None,
        on_upgrade=lambda message: upgrader.handle(message),
        on_builds=installer.mirror.use,
        on_training=lambda message: training.handle(message),
    )
    preparer = TrainingPreparer(
        config.cache_path,
        installer.weights_dir,
        installer.blob,
        installer.engine,
        pypi_url=config.engines.llamacpp.pypi_url,
    )
    training = TrainingJobs(
        inventory.node_id,
        config.work_path,
        preparer,
        session.send,
        engine_user=engine_user(config.run_as, config.work_path),
        device_uuids={device.index: device.uuid for device in inventory.gpus},
    )
    upgrader = AgentUpgrader(
        config.work_path,
        config.path(config.release.trusted_pub),
        sources.fetcher,
        PipInstaller(),
        restarting.request if restarting else lambda reason: stop.set(),
        session.send,
    )
    if restarting is not None:
        restarting.on_withdrawn = session.register_again
    collector = WeightsCollector(
        installer.weights_dir,
        lambda: [shard.spec for shard in shards.shards.values()],
        installer.weights_lock,
        keep_hours=config.weights_keep_hours,
        max_gb=config.weights_max_gb,
    )
    kv_reporter = KvReporter(shards.shards, session.send)

    def on_stream() -> None:  # what the control plane may have missed while the stream was down
        kv_reporter.resend()
        training.resend()

    session.on_each_stream(on_stream)

    components = components if components is not None else supervising.Supervisor()
    components.add("session", session.run)
    components.add("kv-events", kv_reporter.run)
    components.add("weights-gc", collector.run)
    if restarting is not None:
        components.add("config-watch", restarting.watch_file)
    if inventory.gpus:
        components.add("telemetry", lambda: sample_cards(gpus, config, session, shards))
    if config.metrics.port:
        components.add("metrics", lambda: serve_metrics(config.metrics.host, config.metrics.port))
    firewall = agent_source(
        config.node_id,
        config.firewall.enabled,
        config.address,
        (config.ports.first, config.ports.last),
        lambda: session.control_planes,
    )
    components.add("firewall", FirewallKeeper(firewall, FirewallState(), Nft()).run)
    try:
        await run_components(components, stop)
    finally:
        await links.close()
        failed = [h for h in components.health() if h.restarts]
        if failed:
            log.warning(
                "components that failed while the agent ran: %s",
                "; ".join(f"{h.name} ({h.restarts} restarts, last: {h.last_error})" for h in failed),
            )
        if restarting is not None and restarting.reason:
            if trial is not None:
                trial.stopped()
            tracing.shutdown()
            start_again(command_line())  # never returns: the engines stay, the next agent adopts them
        if keep_engines:
            log.info(
                "stopping with the engines of %d shards left running for the next agent", len(shards.shards)
            )
        else:
            await shards.stop_all()
        await training.stop_all()
        tracing.shutdown()


async def run_components(components: supervising.Supervisor, stop: asyncio.Event) -> None:
    """Run the components until ``stop``; ComponentFailed as it is when a FATAL one fails."""
    try:
        async with asyncio.TaskGroup() as tasks:
            running = tasks.create_task(components.run(), name="components")
            stopping = tasks.create_task(stop.wait(), name="stop")
            await asyncio.wait({running, stopping}, return_when=asyncio.FIRST_COMPLETED)
            stopping.cancel()
            components.shutdown()
    except BaseExceptionGroup as group:
        raise group.exceptions[0] from None


async def sample_cards(
    gpus: GpuSource, config: AgentConfig, session: AgentSession, shards: Supervisor
) -> None:
    """Send the cards' telemetry to the control plane; nvidia-smi's full report every minute."""
    full = NvidiaSmi(config.nvidia_smi) if not isinstance(gpus, NvidiaSmi) else None
    sampler = Sampler(gpus, lambda: descendants(os.getpid()) | shards.engine_pids(), full_report=full)
    await sampler.run(publishing_gpus(config.node_id, session.send))


async def run_until_signalled(config_path: Path, keep_engines: bool = False) -> None:
    """Run the agent of ``config_path`` until SIGINT or SIGTERM; it starts itself again when asked.

    New settings from the control plane are on trial (:mod:`llmgw.agent.settingstrial`): an agent
    that fails to start on them goes back to the last good ones and starts again on those.
    """
    trial = SettingsTrial(config_path)
    trial.begin()
    stop = asyncio.Event()
    try:
        config = load_agent_config(config_path)
        kept = kept_settings(config_path)
        if kept:
            log.info("running with the control plane's settings: %s", json.dumps(kept, sort_keys=True))
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        restarting = Restarting(config_path, lambda reason: stop.set(), trial)
        await run_agent(config, stop, restarting, trial=trial, keep_engines=keep_engines)
    except Exception as error:
        if trial.fail(error) is not None:
            start_again(command_line())  # on the last good settings; never returns
        raise
    finally:
        trial.stopped()
