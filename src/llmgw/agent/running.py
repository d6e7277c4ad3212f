"""Wiring of one agent process: discovery, installer, supervisor, session."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path

from llmgw.agent.config import AgentConfig, kept_settings, load_agent_config
from llmgw.agent.discovery import choose_source, discover
from llmgw.agent.engineuser import engine_user
from llmgw.agent.gpus import GpuSource
from llmgw.agent.installing import Installer
from llmgw.agent.kv_reporting import KvReporter
from llmgw.agent.nvidia_smi import NvidiaSmi
from llmgw.agent.restarting import Restarting, command_line, start_again
from llmgw.agent.session import AgentSession
from llmgw.agent.supervising import Supervisor
from llmgw.agent.telemetry import Sampler, descendants
from llmgw.protocol.channels import AgentChannel
from llmgw.protocol.grpc_transport import GrpcConnector, TlsFiles

log = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 3.0
"""How long to wait for one control plane's TLS channel before trying the next."""


async def run_agent(config: AgentConfig, stop: asyncio.Event, restarting: Restarting | None = None) -> None:
    """Run until ``stop``; when ``restarting`` asks, start this same command again, engines serving."""
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
    session_box: list[AgentSession] = []

    def fetcher():  # type: ignore[no-untyped-def]
        target = session_box[0].current or config.control_planes[0]

        def fetch(sha256: str, offset: int) -> AsyncIterator[bytes]:
            return GrpcConnector(target, tls).fetch(sha256, offset)

        return fetch

    installer = Installer(config, lambda: inventory, fetcher)
    config.work_path.mkdir(parents=True, exist_ok=True)
    supervisor = Supervisor(
        config.work_path,
        config.shards,
        installer.prepare,
        ports=(config.ports.first, config.ports.last),
        host=config.address,
        device_uuids={device.index: device.uuid for device in inventory.gpus},
        gpus=gpus if inventory.gpus else None,
        engine_user=engine_user(config.run_as, config.work_path),
    )
    supervisor.adopt()

    async def connect(target: str) -> AgentChannel:
        return await GrpcConnector(target, tls).connect(timeout_s=CONNECT_TIMEOUT_S)

    session = AgentSession(
        inventory,
        supervisor,
        config.control_planes,
        connect,
        engines=installer.installed_engines,
        on_settings=restarting.on_settings if restarting else None,
        on_restart=restarting.request if restarting else None,
    )
    session_box.append(session)
    kv_reporter = KvReporter(supervisor.shards, session.send)
    session.on_stream = kv_reporter.resend
    running = [
        asyncio.create_task(session.run(), name="agent-session"),
        asyncio.create_task(kv_reporter.run(), name="agent-kv-events"),
    ]
    if restarting is not None:
        running.append(asyncio.create_task(restarting.watch_file(), name="agent-config-watch"))
    if inventory.gpus:
        running.append(
            asyncio.create_task(sample_cards(gpus, config, session, supervisor), name="agent-telemetry")
        )
    try:
        await stop.wait()
    finally:
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        if restarting is not None and restarting.reason:
            start_again(command_line())  # never returns: the engines stay, the next agent adopts them
        await supervisor.stop_all()


async def sample_cards(
    gpus: GpuSource, config: AgentConfig, session: AgentSession, supervisor: Supervisor
) -> None:
    """Send the cards' telemetry to the control plane; nvidia-smi's full report every minute."""
    full = NvidiaSmi(config.nvidia_smi) if not isinstance(gpus, NvidiaSmi) else None
    sampler = Sampler(gpus, lambda: descendants(os.getpid()) | supervisor.engine_pids(), full_report=full)
    await sampler.run(session.send)


async def run_until_signalled(config_path: Path) -> None:
    """Run the agent of ``config_path`` until SIGINT or SIGTERM; it starts itself again when asked."""
    config = load_agent_config(config_path)
    kept = kept_settings(config_path)
    if kept:
        log.info("running with the control plane's settings: %s", json.dumps(kept, sort_keys=True))
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    restarting = Restarting(config_path, lambda reason: stop.set())
    await run_agent(config, stop, restarting)
