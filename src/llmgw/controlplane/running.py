"""Running one control plane process: its parts (``wiring.py``) under one supervisor, until stopped.

Start: build the parts, start the agent server, run the supervisor; once the
HTTP server listens (an event, :attr:`HttpServer.listening`), leadership joins
with the addresses this process is reached at, and :attr:`ControlPlane.ready`
is set. Stop, in order: the agents' streams end at once (so agents move to
another control plane), leadership and the leader's work stop and the lease is
given up, the gateway workers (if any) finish theirs and exit, the HTTP server
finishes its requests (those it relays go to the next leader, which it keeps
learning of meanwhile), the other components stop
(the usage writer writes what waits), then every part is closed. A FATAL
component's failure ends :meth:`ControlPlane.run` with
:class:`~llmgw.runtime.supervising.ComponentFailed` (exit code 1).

A restart (``POST /api/control-plane/restart``, :mod:`llmgw.controlplane.selfrestart`)
makes the same clean stop, keeping the HTTP listening socket open (or, behind
gateway workers, the workers running and serving), then the process executes
its own command again and serves on that socket (or takes the workers over).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Sequence

from llmgw.controlplane.agentsettings import SettingsCheck, forbidden_only
from llmgw.controlplane.config import ServerConfig
from llmgw.controlplane.firewalling import server_source
from llmgw.controlplane.leadership import Identity
from llmgw.controlplane.selfrestart import hand_over, hand_over_workers, start_again
from llmgw.controlplane.wiring import ControlPlaneParts, wire
from llmgw.core.knowledge import KnowledgeSearch
from llmgw.operations.firewallkeeping import FirewallKeeper
from llmgw.operations.nftables import FirewallState, Nft
from llmgw.runtime import collector
from llmgw.runtime.supervising import Supervisor

log = logging.getLogger(__name__)


class ControlPlane:
    """One control plane: leads while it holds the lease, stands by (relaying to the leader) otherwise."""

    def __init__(
        self,
        config: ServerConfig,
        check_agent_settings: SettingsCheck = forbidden_only,
        worker_log_args: Sequence[str] = (),
        knowledge: KnowledgeSearch | None = None,
    ) -> None:
        self.config = config
        self._knowledge = knowledge
        """What the gateway searches knowledge collections with (None: wiring's own choice)."""
        self._worker_log_args = worker_log_args
        """How gateway workers log (``--log-level``, ``--log-json``): as this process does."""
        self._check_agent_settings = check_agent_settings
        """How agents' settings are checked before they are kept: agent.yaml's schema, from the wiring."""
        self.supervisor = Supervisor()
        """Every long-lived component of this process; its health is shown by /api/status."""
        self.ready = asyncio.Event()
        self.http_port = 0
        self.agent_port = 0
        self.restarting = False
        """Set when the run ended for a restart (``/api/control-plane/restart``): start the command again."""

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set; ComponentFailed when a FATAL component fails."""
        supervisor = self.supervisor
        async with contextlib.AsyncExitStack() as closing:
            parts = await wire(
                self.config,
                self._check_agent_settings,
                supervisor,
                closing,
                self._worker_log_args,
                knowledge=self._knowledge,
            )
            self.agent_port = await parts.agent_server.start()
            # What is built by now (modules, the parts) lives as long as the process: kept out of the
            # collector's full passes, and the thresholds raised so that those are rare, which otherwise
            # stall a reconcile pass (or a request) by tens of milliseconds (bench/control_plane/README.md).
            collector.settle()
            try:
                async with asyncio.TaskGroup() as tasks:
                    supervising = tasks.create_task(supervisor.run(), name="supervisor")
                    listening = tasks.create_task(parts.http.listening.wait(), name="http-listening")
                    await asyncio.wait({supervising, listening}, return_when=asyncio.FIRST_COMPLETED)
                    if listening.done():
                        self._serving(parts)
                        stopping = tasks.create_task(stop.wait(), name="stop")
                        restart = parts.admin.state.self_restart.requested
                        restarting = tasks.create_task(restart.wait(), name="restart")
                        await asyncio.wait(
                            {supervising, stopping, restarting}, return_when=asyncio.FIRST_COMPLETED
                        )
                        self.restarting = restarting.done() and not stopping.done()
                        stopping.cancel()
                        restarting.cancel()
                    listening.cancel()
                    if not supervising.done():
                        await self._stop(parts)
            except BaseExceptionGroup as group:
                raise group.exceptions[0] from None  # the supervisor's own error, as it is

    def _serving(self, parts: ControlPlaneParts) -> None:
        config = self.config
        self.http_port = parts.http.port
        me = Identity(
            config.name,
            f"{config.agent_server.host}:{self.agent_port}",
            f"http://{config.http.host}:{self.http_port}",
        )
        self.supervisor.add("leadership", lambda: parts.leadership.run(me))
        firewall = server_source(
            parts.store,
            config.name,
            (config.http.host, self.http_port),
            (config.agent_server.host, self.agent_port),
        )
        self.supervisor.add("firewall", FirewallKeeper(firewall, FirewallState(), Nft()).run)
        log.info(
            "control plane %s serving on %s, agents on %s", config.name, me.http_address, me.agent_address
        )
        self.ready.set()

    async def _stop(self, parts: ControlPlaneParts) -> None:
        supervisor = self.supervisor
        await parts.agent_server.stop()  # agents' streams end at once: they move to another control plane
        for name in ("leadership", "leader-duties", "reconciler"):
            await supervisor.stop(name)
        if self.restarting and parts.workers is None and parts.leadership.serving:
            # A leader starting again finishes what it accepted while it still leads, and only then
            # gives up the lease: a request accepted after it resigned would wait for a leader that,
            # with no other control plane, only its next start can be. New connections wait in the
            # backlog of the socket handed over.
            hand_over(parts.http.servers[0].sockets[0])
            parts.admin.state.changes.close()
            await parts.http.stop()
            await parts.leadership.resign()
            parts.sessions.let_go()
            supervisor.shutdown()
            return
        handing_workers = self.restarting and parts.workers is not None
        if handing_workers:
            # The workers keep the port served while this process starts again: without their channel
            # they keep their copy and answer /v1 from it (a plane resigning would tell them to pass
            # /v1 on), and they connect to the next start's channel, which stops them once its own
            # workers serve (selfrestart.py).
            await supervisor.stop("worker-channel")
            assert parts.workers is not None
            hand_over_workers(parts.http.port, parts.workers.hand_over())
        await parts.leadership.resign()
        # requests still held (relayed) go to whoever leads next, learnt while the server finishes them
        following = asyncio.create_task(parts.leadership.follow(), name="follow-leader")
        parts.sessions.let_go()
        parts.admin.state.changes.close()  # event streams end, or the HTTP server would wait on them
        if parts.workers is not None and not handing_workers:
            await parts.workers.stop()  # they finish their requests, still handing /api to this process
        elif self.restarting:  # clients connecting meanwhile wait in the backlog for the next start
            hand_over(parts.http.servers[0].sockets[0])
        try:
            await parts.http.stop()
        finally:
            following.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await following
        supervisor.shutdown()  # the rest: the load reader, the usage writer (it writes what waits)


async def run_until_signalled(
    config: ServerConfig,
    check_agent_settings: SettingsCheck = forbidden_only,
    worker_log_args: Sequence[str] = (),
) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    plane = ControlPlane(config, check_agent_settings, worker_log_args)
    await plane.run(stop)
    if plane.restarting:
        log.info("control plane %s stopped cleanly: starting again", config.name)
        start_again()
