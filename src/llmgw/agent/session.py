"""The agent's session with the leading control plane: connect, register, obey, report.

The agent keeps one stream open; when it ends, it reconnects with backoff,
trying each control plane it knows. The backoff starts again after a session
that worked, so each failover does not make the next one slower.

The leader tells the agent every control plane there is. A standby answers
a registration with the leader's address, and the agent goes there at once;
while no control plane leads (a failover), it asks that standby again after
:data:`STANDBY_RETRY_S`, then a little later each time up to
:data:`STANDBY_RETRY_CAP_S`, each delay shortened by a random part of up to
half (jitter): a thousand nodes whose leader died together neither ask the
standby in step while its lease lapses nor all register in the same instant
once it leads, and each reaches the new leader within about two seconds of its
taking the lease. (The agent's connector keeps its TLS channel to a control
plane between such tries: each costs a stream, not a handshake.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from llmgw import __version__
from llmgw.agent.logserving import LogServing
from llmgw.agent.supervising import ShardSupervisor
from llmgw.core.agentstream import AgentMessage
from llmgw.core.backoff import Backoff
from llmgw.core.devices import NodeInventory
from llmgw.core.mirrorbuilds import MirrorBuilds
from llmgw.core.nodes import (
    Heartbeat,
    NodeRegistration,
    Registered,
    RestartAgent,
    SettingsRefusal,
    SettingsUpdate,
)
from llmgw.core.shardlogs import LogRequest
from llmgw.core.shards import RunningShard, ShardSpec, ShardStatus, StopShard
from llmgw.core.trainingstream import CancelTraining, StartTraining, TrainingCollected, TrainingFetch
from llmgw.core.upgrades import UpgradeAgent
from llmgw.errors import ChannelClosed
from llmgw.protocol.channels import AgentChannel
from llmgw.protocol.links import AgentLink, agent_link

log = logging.getLogger(__name__)

Connect = Callable[[str], Awaitable[AgentChannel]]

STANDBY_RETRY_S = 0.5
"""How soon to ask a standby again, the first time, when it knows of no leader."""
STANDBY_RETRY_CAP_S = 2.0
"""The longest wait before asking a standby that knows of no leader again."""
STANDBY_RETRY_FACTOR = 1.5
STANDBY_RETRY_JITTER = 0.5

UNREACHABLE_MEMORY_S = 15.0
"""For this long after a control plane failed the agent, a standby naming it leader is not believed:
the lease of a leader that died still names it until it lapses."""

TrainingCommand = StartTraining | CancelTraining | TrainingFetch | TrainingCollected

ANSWER_TIMEOUT_S = 10.0
"""How long a control plane may take to answer a registration before the agent tries again."""

WORKED, STANDBY, FAILED = "worked", "standby", "failed"


class AgentSession:
    """Keeps the agent connected to a control plane and carries out its commands."""

    def __init__(
        self,
        inventory: NodeInventory,
        supervisor: ShardSupervisor,
        control_planes: list[str],
        connect: Connect,
        engines: Callable[[], list[str]] = list,
        backoff: Backoff | None = None,
        standby_retry_s: float = STANDBY_RETRY_S,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        standby_backoff: Backoff | None = None,
        answer_timeout_s: float = ANSWER_TIMEOUT_S,
        on_settings: Callable[[str], None] | None = None,
        on_restart: Callable[[str], None] | None = None,
        refusal: Callable[[], SettingsRefusal | None] = lambda: None,
        on_registered: Callable[[], None] = lambda: None,
        on_upgrade: Callable[[UpgradeAgent], None] | None = None,
        on_builds: Callable[[MirrorBuilds], None] = lambda builds: None,
        on_training: Callable[[TrainingCommand], None] | None = None,
        on_stream: Callable[[], None] = lambda: None,
    ) -> None:
        self._on_training = on_training
        self._answer_timeout_s = answer_timeout_s
        self._on_upgrade = on_upgrade
        self._on_builds = on_builds
        self._refusal = refusal
        """The settings the agent went back from, told in each registration."""
        self._on_registered = on_registered
        """Called once a leader has accepted a registration (the settings it runs on are good)."""
        self._channel: AgentLink | None = None
        self._on_settings = on_settings
        self._on_restart = on_restart
        self._inventory = inventory
        self._supervisor = supervisor
        self.control_planes = list(control_planes)
        self._connect = connect
        self._engines = engines
        self._backoff = backoff or Backoff(base=0.5, factor=2.0, cap=15.0)
        self._outbox: asyncio.Queue[AgentMessage] = asyncio.Queue()
        self.connected = asyncio.Event()
        supervisor.report = self._report
        self.current: str = ""
        self.leader: str = ""
        """The leading control plane's name, as last told."""
        self._next: str = ""
        self._standby_backoff = standby_backoff or Backoff(
            base=standby_retry_s,
            factor=STANDBY_RETRY_FACTOR,
            cap=max(standby_retry_s, STANDBY_RETRY_CAP_S),
            jitter=STANDBY_RETRY_JITTER,
        )
        """The delays between asking a standby that knows of no leader again (reset once pointed on)."""
        self._sleep = sleep
        self._failed_at: dict[str, float] = {}
        self._clock = clock
        self._stopping: set[asyncio.Task[None]] = set()
        self._logs = LogServing(inventory.node_id, supervisor.log_of, self.send)
        self.on_stream = on_stream
        """Called on each new stream once registered (the KV reporter sends its full copies)."""

    def on_each_stream(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` on each new stream once registered (the KV reporter sends its full copies)."""
        self.on_stream = listener

    def send(self, message: AgentMessage) -> None:
        """Queue a message (telemetry) for the control plane; dropped while not connected."""
        if self.connected.is_set():
            self._outbox.put_nowait(message)

    def _report(self, status: ShardStatus) -> None:
        if self.connected.is_set():
            self._outbox.put_nowait(status)

    def _target(self, turn: int) -> str:
        if self._next:
            target, self._next = self._next, ""
            return target
        return self.control_planes[turn % len(self.control_planes)]

    async def run(self) -> None:
        """Stay connected until cancelled: a stream that ends (ChannelClosed) is opened again.

        Any other error ends the run; the process supervisor logs it, shows it in the
        agent's health and runs the session again after its backoff.
        """
        turn = 0
        while True:
            target = self._target(turn)
            turn += 1
            try:
                channel = await self._connect(target)
            except ChannelClosed as error:
                self._failed_at[target] = self._clock()
                delay = self._backoff.next_delay()
                log.warning("%s; trying again in %.1f s", error, delay)
                await self._sleep(delay)
                continue
            outcome = await self._serve(channel, target)
            if outcome != STANDBY:
                self._failed_at[target] = self._clock()
            if outcome == WORKED:
                self._backoff.reset()
                self._standby_backoff.reset()
                delay = self._backoff.next_delay()
            elif outcome == STANDBY and self._next != target:  # pointed to the leader: there at once
                self._standby_backoff.reset()
                delay = 0.0
            elif outcome == STANDBY:  # no leader yet: ask again a little later each time
                delay = self._standby_backoff.next_delay()
            else:
                delay = self._backoff.next_delay()
            if delay:
                log.info("reconnecting in %.1f s", delay)
                await self._sleep(delay)

    def _learn(self, registered: Registered) -> None:
        for address in registered.control_planes:
            if address and address not in self.control_planes:
                log.info("learnt of control plane %s", address)
                self.control_planes.append(address)
        self.leader = registered.leader

    def _registration(self, shards: list[RunningShard]) -> NodeRegistration:
        return NodeRegistration(
            inventory=self._inventory,
            shards=tuple(shards),
            engines=tuple(self._engines()),
            agent_version=__version__,
            refused_settings=self._refusal(),
        )

    def register_again(self) -> None:
        """End the stream so that the next one registers afresh (what the registration tells changed)."""
        channel = self._channel
        if channel is not None:
            log.info("registering again: what the registration tells changed")
            task = asyncio.create_task(channel.close())
            self._stopping.add(task)
            task.add_done_callback(self._stopping.discard)

    async def _serve(self, wire: AgentChannel, target: str) -> str:
        """One session: WORKED once the leader accepted the registration, STANDBY when pointed on."""
        self._outbox = asyncio.Queue()
        registered = False
        channel = agent_link(wire)
        try:
            registering = self._supervisor.snapshot()
            await channel.send(self._registration(registering))
            try:
                answer = await asyncio.wait_for(channel.receive(), self._answer_timeout_s)
            except TimeoutError:
                log.warning(
                    "%s did not answer the registration within %.1f s", target, self._answer_timeout_s
                )
                return FAILED
            if not isinstance(answer, Registered):
                log.warning("%s answered the registration with %s", target, type(answer).__name__)
                return FAILED
            self._learn(answer)
            if answer.standby:
                leader = answer.leader_address
                failed_at = self._failed_at.get(leader)
                believed = failed_at is None or self._clock() - failed_at > UNREACHABLE_MEMORY_S
                self._next = leader if leader and leader != target and believed else target
                log.info(
                    "%s stands by; %s",
                    target,
                    f"the leader is {answer.leader} at {leader}" if leader else "no leader yet",
                )
                return STANDBY
            registered = True
            self.current = target
            self._failed_at.clear()
            log.info("registered with %s (leader %s)", target, answer.leader)
            self._on_registered()
            self._channel = channel
            self.connected.set()
            self._report_changed_since(registering)
            self.on_stream()
            async with asyncio.TaskGroup() as tasks:
                sender = tasks.create_task(self._send_loop(channel))
                try:
                    await self._receive_loop(channel)
                finally:
                    sender.cancel()
        except* ChannelClosed as group:
            log.warning("session with %s ended: %s", target, group.exceptions[0])
        finally:
            self._channel = None
            self.connected.clear()
            self._logs.cancel_all()
            self.current = ""
            with contextlib.suppress(Exception):
                await channel.close()
        task = asyncio.current_task()
        if task is not None and task.cancelling():
            # Python 3.11's TaskGroup drops a cancellation that comes with a child's error (the agent
            # told to stop as its stream ends): without this the session would reconnect for ever.
            raise asyncio.CancelledError
        return WORKED if registered else FAILED

    def _report_changed_since(self, registering: list[RunningShard]) -> None:
        """Report each shard whose state moved on while the registration was answered (C2.2)."""
        told = {shard.replica_id: shard.state for shard in registering}
        for shard in list(self._supervisor.shards.values()):
            if told.get(shard.replica_id) != shard.state:
                self._report(shard.status())

    async def _send_loop(self, channel: AgentLink) -> None:
        while True:
            message = await self._outbox.get()
            await channel.send(message)

    async def _receive_loop(self, channel: AgentLink) -> None:
        while True:
            message = await channel.receive()
            match message:
                case ShardSpec():
                    log.info("start shard %s (%s)", message.replica_id, message.model)
                    self._supervisor.start(message)
                case StopShard():
                    task = asyncio.create_task(self._supervisor.stop(message.replica_id, message.reason))
                    self._stopping.add(task)
                    task.add_done_callback(self._stopping.discard)
                case Heartbeat():
                    pass
                case Registered():
                    self._learn(message)  # the control planes changed
                case LogRequest():
                    self._logs.handle(message)
                case SettingsUpdate() if self._on_settings is not None:
                    self._on_settings(message.yaml)
                case RestartAgent() if self._on_restart is not None:
                    self._on_restart(message.reason or "the control plane asked (RestartAgent)")
                case UpgradeAgent() if self._on_upgrade is not None:
                    self._on_upgrade(message)
                case MirrorBuilds():
                    self._on_builds(message)
                case StartTraining() | CancelTraining() | TrainingFetch() | TrainingCollected() if (
                    self._on_training is not None
                ):
                    self._on_training(message)
                case _:
                    log.info("ignoring %s from the control plane", type(message).__name__)
