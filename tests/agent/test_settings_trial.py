"""New settings are on trial until the agent registers with them; a failed start goes back (C2.4)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import yaml

from llmgw.agent.config import AgentConfig, ShardSettings, keep_settings, kept_settings, save_agent_config
from llmgw.agent.restarting import Restarting
from llmgw.agent.session import AgentSession
from llmgw.agent.settingstrial import CRASHED, GOOD_FILE, TRYING_FILE, SettingsTrial
from llmgw.agent.supervising import ShardSupervisor
from llmgw.core.backoff import Backoff
from llmgw.core.devices import NodeInventory
from llmgw.core.nodes import SettingsRefusal
from llmgw.protocol import agent_pb2 as pb
from llmgw.protocol.channels import AgentChannel, MemoryChannel, memory_pair

GOOD: dict[str, Any] = {"shards": {"stop_grace_s": 7.0}}
BAD: dict[str, Any] = {"work_dir": "/proc/llmgw"}


@pytest.fixture
def config_path(tmp_path: Path) -> Path:
    path = tmp_path / "agent.yaml"
    save_agent_config(AgentConfig(node_id="gpu1", control_planes=["127.0.0.1:7000"]), path)
    return path


def started_with(config_path: Path, settings: dict[str, Any]) -> None:
    """An agent that ran on ``settings`` and registered: they are the good ones."""
    keep_settings(config_path, settings)
    trial = SettingsTrial(config_path)
    trial.begin()
    trial.on_registered()


def test_settings_the_agent_registered_with_become_the_good_ones(config_path: Path) -> None:
    started_with(config_path, GOOD)
    assert SettingsTrial(config_path).good() == GOOD
    assert not (config_path.parent / TRYING_FILE).exists()


def test_a_start_that_fails_on_new_settings_goes_back_to_the_good_ones(config_path: Path) -> None:
    started_with(config_path, GOOD)
    keep_settings(config_path, BAD)
    trial = SettingsTrial(config_path, clock=lambda: 1234.0)
    assert trial.begin() is None and trial.trying
    refusal = trial.fail(FileNotFoundError(2, "No such file or directory", "/proc/llmgw"))
    assert refusal == SettingsRefusal(
        settings="work_dir: /proc/llmgw\n",
        reason="FileNotFoundError: [Errno 2] No such file or directory: '/proc/llmgw'",
        refused_at=1234.0,
    )
    assert kept_settings(config_path) == GOOD
    again = SettingsTrial(config_path)
    assert again.begin() is None and not again.trying
    assert again.refusal() == refusal and again.refused() == BAD


def test_a_start_that_found_the_last_one_ended_unregistered_on_its_settings_goes_back(
    config_path: Path,
) -> None:
    started_with(config_path, GOOD)
    keep_settings(config_path, BAD)
    SettingsTrial(config_path).begin()  # this agent then dies before it registers: no fail(), no stopped()
    refusal = SettingsTrial(config_path).begin()
    assert refusal is not None and refusal.reason == CRASHED
    assert kept_settings(config_path) == GOOD


def test_without_good_settings_a_failed_start_goes_back_to_agent_yaml_alone(config_path: Path) -> None:
    keep_settings(config_path, BAD)
    trial = SettingsTrial(config_path)
    trial.begin()
    assert trial.fail(PermissionError("no")) is not None
    assert kept_settings(config_path) == {} and not (config_path.parent / "settings.yaml").exists()


def test_an_agent_stopped_before_it_registers_gives_no_verdict(config_path: Path) -> None:
    started_with(config_path, GOOD)
    keep_settings(config_path, BAD)
    trial = SettingsTrial(config_path)
    trial.begin()
    trial.stopped()
    assert SettingsTrial(config_path).begin() is None
    assert kept_settings(config_path) == BAD


def test_a_failure_after_registering_refuses_nothing(config_path: Path) -> None:
    started_with(config_path, GOOD)
    keep_settings(config_path, BAD)
    trial = SettingsTrial(config_path)
    trial.begin()
    trial.on_registered()
    assert trial.fail(RuntimeError("later")) is None
    assert (
        kept_settings(config_path) == BAD
        and yaml.safe_load((config_path.parent / GOOD_FILE).read_text()) == BAD
    )


def refused_agent(config_path: Path) -> tuple[Restarting, list[str], list[str]]:
    started_with(config_path, GOOD)
    keep_settings(config_path, BAD)
    trial = SettingsTrial(config_path)
    trial.begin()
    trial.fail(FileNotFoundError("/proc/llmgw"))
    asked: list[str] = []
    withdrawn: list[str] = []
    restarting = Restarting(config_path, asked.append, SettingsTrial(config_path))
    restarting.on_withdrawn = lambda: withdrawn.append("again")
    return restarting, asked, withdrawn


def test_refused_settings_sent_again_are_declined(config_path: Path) -> None:
    restarting, asked, withdrawn = refused_agent(config_path)
    restarting.on_settings("work_dir: /proc/llmgw\n")
    assert asked == [] and withdrawn == []
    assert kept_settings(config_path) == GOOD


def test_other_settings_withdraw_the_refusal_and_are_tried(config_path: Path) -> None:
    restarting, asked, withdrawn = refused_agent(config_path)
    restarting.on_settings("work_dir: /srv/llmgw\n")
    assert asked == ["the control plane's settings changed"] and withdrawn == []
    assert SettingsTrial(config_path).refusal() is None
    assert kept_settings(config_path) == {"work_dir": "/srv/llmgw"}


def test_the_good_settings_sent_again_withdraw_the_refusal_without_a_restart(config_path: Path) -> None:
    restarting, asked, withdrawn = refused_agent(config_path)
    restarting.on_settings(yaml.safe_dump(GOOD))
    assert asked == [] and withdrawn == ["again"]
    assert SettingsTrial(config_path).refusal() is None


async def test_the_registration_tells_the_refusal_and_a_registered_session_makes_the_settings_good(
    tmp_path: Path,
) -> None:
    agent_side, control = memory_pair("gpu1")

    async def connect(target: str) -> AgentChannel:
        return agent_side

    async def prepare(spec: pb.StartShard) -> object:
        raise AssertionError("no shard is started here")

    registered: list[str] = []
    refusal = SettingsRefusal(
        settings="work_dir: /proc/llmgw\n", reason="FileNotFoundError: x", refused_at=5.0
    )
    session = AgentSession(
        NodeInventory(node_id="gpu1", address="127.0.0.1", cpu_cores=1, memory_mb=1024),
        ShardSupervisor(tmp_path, ShardSettings(), prepare),  # type: ignore[arg-type]
        ["cp:1"],
        connect,
        refusal=lambda: refusal,
        on_registered=lambda: registered.append("yes"),
    )
    running = asyncio.create_task(session.run())
    try:
        first = await asyncio.wait_for(control.receive(), 5)
        told = first.register.refused_settings
        assert (told.settings, told.reason, told.refused_unix_s) == (
            "work_dir: /proc/llmgw\n",
            "FileNotFoundError: x",
            5.0,
        )
        assert registered == []
        await control.send(pb.ControlMessage(registered=pb.Registered(leader="cp1")))
        await asyncio.wait_for(session.connected.wait(), 5)
        assert registered == ["yes"]
    finally:
        running.cancel()


async def test_a_session_asked_to_register_again_opens_a_new_stream_and_registers(tmp_path: Path) -> None:
    streams: asyncio.Queue[MemoryChannel[pb.ControlMessage, pb.AgentMessage]] = asyncio.Queue()

    async def connect(target: str) -> AgentChannel:
        agent_side, control = memory_pair("gpu1")
        streams.put_nowait(control)
        return agent_side

    async def prepare(spec: pb.StartShard) -> object:
        raise AssertionError("no shard is started here")

    refusals: list[SettingsRefusal | None] = [SettingsRefusal(settings="{}", reason="x")]
    session = AgentSession(
        NodeInventory(node_id="gpu1", address="127.0.0.1", cpu_cores=1, memory_mb=1024),
        ShardSupervisor(tmp_path, ShardSettings(), prepare),  # type: ignore[arg-type]
        ["cp:1"],
        connect,
        backoff=Backoff(base=0.0, factor=1.0, cap=0.0),
        refusal=lambda: refusals[-1],
    )
    running = asyncio.create_task(session.run())
    try:
        first = await asyncio.wait_for(streams.get(), 5)
        assert (await first.receive()).register.HasField("refused_settings")
        await first.send(pb.ControlMessage(registered=pb.Registered(leader="cp1")))
        await asyncio.wait_for(session.connected.wait(), 5)
        refusals.append(None)
        session.register_again()
        second = await asyncio.wait_for(streams.get(), 5)
        assert not (await second.receive()).register.HasField("refused_settings")
    finally:
        running.cancel()
