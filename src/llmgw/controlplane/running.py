"""Running one control plane process: its parts (``wiring.py``) under one supervisor, until stopped.

The process is run by :func:`~llmgw.runtime.processes.run_process` (the stop
signals, the supervisor, the error shown, the closing of every part):
:func:`~llmgw.controlplane.wiring.build` builds the parts and
:meth:`ControlPlane._serve` serves them.

Start: build the parts, start the agent server, run the components; once the
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

A restart (``POST /api/control-plane/restart``, :mod:`llmgw.controlplane.lifecycle.selfrestart`)
makes the same clean stop, keeping the HTTP listening socket open (or, behind
gateway workers, the workers running and serving), then the process executes
its own command again and serves on that socket (or takes the workers over).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence

from llmgw.controlplane.config import ServerConfig
from llmgw.controlplane.lifecycle.leadership import Identity
from llmgw.controlplane.lifecycle.selfrestart import hand_over, hand_over_workers, start_again
from llmgw.controlplane.nodes.agentsettings import SettingsCheck, forbidden_only
from llmgw.controlplane.nodes.firewalling import server_source
from llmgw.controlplane.wiring import ControlPlaneParts, add_components, build
from llmgw.core.knowledge import KnowledgeSearch
from llmgw.operations.firewallkeeping import FirewallKeeper
from llmgw.operations.nftables import FirewallState, Nft
from llmgw.runtime import collector
from llmgw.runtime.processes import Process, run_process
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

    async def run(self, stop: asyncio.Event | None = None) -> None:
        """Serve until ``stop`` is set (None: until a stop signal); ComponentFailed when a FATAL
        component fails."""
        if stop is None:
            await run_process(self._build, self._serve, Process(self.supervisor))
        else:
            await run_process(self._build, self._serve, Process(self.supervisor, stop=stop), signals=())

    async def _build(self, process: Process) -> ControlPlaneParts:
        return await build(
            self.config,
            process,
            check_agent_settings=self._check_agent_settings,
            worker_log_args=self._worker_log_args,
            knowledge=self._knowledge,
        )

    async def _serve(self, parts: ControlPlaneParts, process: Process) -> None:
        self.agent_port = await parts.agent_server.start()
        # What is built by now (modules, the parts) lives as long as the process: kept out of the
        # collector's full passes, and the thresholds raised so that those are rare, which otherwise
        # stall a reconcile pass (or a request) by tens of milliseconds (bench/control_plane/README.md).
        collector.settle()
        add_components(parts, process.supervisor)
        await parts.http.listening.wait()
        self._serving(parts)
        stopping = asyncio.create_task(process.stop.wait(), name="stop")
        restarting = asyncio.create_task(parts.admin.state.self_restart.requested.wait(), name="restart")
        try:
            await asyncio.wait({stopping, restarting}, return_when=asyncio.FIRST_COMPLETED)
            self.restarting = restarting.done() and not stopping.done()
        finally:
            stopping.cancel()
            restarting.cancel()
        await self._stop(parts)

    def _serving(self, parts: ControlPlaneParts) -> None:
        config = self.config
        self.http_port = parts.http.port
        me = Identity(
            config.name,
            f"{config.agent_server.host}:{self.agent_port}",
            f"http://{config.http.host}:{self.http_port}",
        )
        self.supervisor.add("leadership", lambda: parts.leadership.run(me, parts.prepare_to_lead))
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
        # the runner then stops the rest: the load reader, the usage writer (it writes what waits)


async def run_until_signalled(
    config: ServerConfig,
    check_agent_settings: SettingsCheck = forbidden_only,
    worker_log_args: Sequence[str] = (),
) -> None:
    """Serve until a stop signal (SIGINT, SIGTERM, SIGHUP); start again when a restart was asked for."""
    plane = ControlPlane(config, check_agent_settings, worker_log_args)
    await plane.run()
    if plane.restarting:
        log.info("control plane %s stopped cleanly: starting again", config.name)
        start_again()
