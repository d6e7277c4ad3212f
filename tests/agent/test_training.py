"""The agent's training jobs against a stand-in trainer at the subprocess seam (testing.trainer_standin)."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from llmgw.agent.config import ShardSettings
from llmgw.agent.session import AgentSession
from llmgw.agent.supervising import ShardSupervisor
from llmgw.agent.training import TrainerInputs, TrainingJobs
from llmgw.core.agentstream import AgentMessage
from llmgw.core.devices import NodeInventory
from llmgw.core.mig import mig_number
from llmgw.core.nodes import NodeRegistration, Registered
from llmgw.core.trainingstream import (
    CancelTraining,
    StartTraining,
    TrainingCollected,
    TrainingFetch,
    TrainingPiece,
    TrainingState,
    TrainingStatus,
)
from llmgw.protocol.channels import AgentChannel, memory_pair
from llmgw.protocol.links import control_link
from llmgw.testing import trainer_standin
from llmgw.testing.eventually import eventually

PAIRS = b'{"question": "q1", "answer": "a1"}\n{"question": "q2", "answer": "a2"}\n'


class Node:
    """A node's training jobs, what they sent, and how often a job was prepared."""

    def __init__(self, tmp_path: Path) -> None:
        self.sent: list[AgentMessage] = []
        self.prepared: list[str] = []
        self.converter: Path | None = tmp_path / "convert_lora_to_gguf.py"
        self.jobs = TrainingJobs(
            "node1", tmp_path, self.prepare, self.sent.append, device_uuids={mig_number(1, 0): "MIG-abc"}
        )
        self.base = tmp_path / "base"

    async def prepare(self, start: StartTraining, say: Callable[[str], None]) -> TrainerInputs:
        self.prepared.append(f"{start.job_id}/{start.attempt}")
        say("fetching the base model's files")
        return TrainerInputs(Path(sys.executable), Path(trainer_standin.__file__), self.base, self.converter)

    def statuses(self, job_id: str) -> list[TrainingStatus]:
        return [m for m in self.sent if isinstance(m, TrainingStatus) and m.job_id == job_id]

    def last(self, job_id: str) -> TrainingStatus:
        return self.statuses(job_id)[-1]

    def lines(self, job_id: str) -> list[str]:
        return [line for status in self.statuses(job_id) for line in status.log_lines]

    async def ended(self, job_id: str, state: TrainingState) -> TrainingStatus:
        return await eventually(
            lambda: self.statuses(job_id) and self.last(job_id).state is state and self.last(job_id),
            timeout_s=15,
            message=f"job {job_id} {state}",
        )


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[Node]:
    made = Node(tmp_path)
    yield made
    await made.jobs.stop_all()


def start(
    job_id: str = "j1", attempt: int = 1, device: str = "cpu", gguf: bool = False, **options: object
) -> StartTraining:
    return StartTraining(job_id, attempt, "smollm2", (), device, 0, PAIRS, json.dumps(options), gguf)


async def test_a_job_reports_each_step_and_finishes_with_its_files_checksummed(
    node: Node, tmp_path: Path
) -> None:
    node.jobs.handle(start(steps=4, gguf=True))
    done = await node.ended("j1", TrainingState.FINISHED)
    states = [s.state for s in node.statuses("j1")]
    assert states[0] is TrainingState.PREPARING
    assert states.index(TrainingState.TRAINING) < states.index(TrainingState.CONVERTING)
    progress = [(s.step, s.loss) for s in node.statuses("j1") if s.step and s.state is TrainingState.TRAINING]
    assert [step for step, _ in progress] == [1, 2, 3, 4]
    assert [loss for _, loss in progress] == sorted((loss for _, loss in progress), reverse=True)
    assert done.steps == 4 and done.peak_memory_bytes == 4000
    assert any(s.detail == "fetching the base model's files" for s in node.statuses("j1"))
    out = tmp_path / "training/j1/out"
    assert {f.filename: (f.sha256, f.size) for f in done.results} == {
        name: (hashlib.sha256((out / name).read_bytes()).hexdigest(), (out / name).stat().st_size)
        for name in ("adapter_config.json", "adapter_model.safetensors", "adapter.gguf")
    }
    await eventually(lambda: "pairs 2" in node.lines("j1"), message="the trainer's log lines")
    assert any(line.endswith("device cpu visible ") for line in node.lines("j1"))


async def test_the_same_attempt_again_is_answered_with_its_status_and_never_run_twice(node: Node) -> None:
    node.jobs.handle(start(steps=2))
    await node.ended("j1", TrainingState.FINISHED)
    told = len(node.sent)
    node.jobs.handle(start(steps=2))
    assert node.sent[told:] == [node.jobs.jobs["j1"].status]
    assert node.prepared == ["j1/1"]


async def test_a_second_job_while_one_runs_is_failed_saying_which_runs(node: Node) -> None:
    node.jobs.handle(start("j1", hang=True))
    await eventually(lambda: node.last("j1").state is TrainingState.TRAINING)
    node.jobs.handle(start("j2"))
    refused = node.last("j2")
    assert refused.state is TrainingState.FAILED
    assert "running training job j1" in refused.error and "one job at a time" in refused.error
    assert node.prepared == ["j1/1"]


async def test_cancel_ends_the_trainers_process_group_and_answers_cancelled(node: Node) -> None:
    node.jobs.handle(start(hang=True))
    line = await eventually(lambda: next(x for x in node.lines("j1") if x.startswith("pid ")))
    pid = int(line.split()[1])
    node.jobs.handle(CancelTraining("j1", "the owner cancelled it"))
    cancelled = await node.ended("j1", TrainingState.CANCELLED)
    assert cancelled.error == "the owner cancelled it"

    def gone() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False

    await eventually(gone, message=f"trainer {pid} ended")
    node.jobs.handle(start("j2", steps=1))  # the node is free again
    await node.ended("j2", TrainingState.FINISHED)


async def test_a_trainer_that_dies_fails_the_job_with_its_last_lines(node: Node) -> None:
    node.jobs.handle(start(fail=True))
    failed = await node.ended("j1", TrainingState.FAILED)
    assert "exit" in failed.error and "code 3" in failed.error
    assert "RuntimeError: out of memory" in failed.error
    assert "warming up 29" in failed.error and "warming up 0 " not in failed.error  # the tail only


async def test_a_gguf_job_on_a_node_without_the_converter_fails_saying_what_to_do(node: Node) -> None:
    node.converter = None
    node.jobs.handle(start(gguf=True))
    failed = await node.ended("j1", TrainingState.FAILED)
    assert "conversion script" in failed.error and "llmgw engine install" in failed.error


async def test_a_card_is_shown_to_the_trainer_by_index_and_a_mig_instance_by_uuid(node: Node) -> None:
    node.jobs.handle(start("j1", device="0", steps=1))
    await node.ended("j1", TrainingState.FINISHED)
    assert any(line.endswith("device cuda visible 0") for line in node.lines("j1"))
    node.jobs.handle(start("j2", device="1/mig0", steps=1))
    await node.ended("j2", TrainingState.FINISHED)
    assert any(line.endswith("device cuda visible MIG-abc") for line in node.lines("j2"))
    node.jobs.handle(start("j3", device="7/mig2"))
    failed = await node.ended("j3", TrainingState.FAILED)
    assert "'7/mig2' is not one of this node's" in failed.error


async def test_results_are_fetched_in_pieces_and_removed_once_collected(node: Node, tmp_path: Path) -> None:
    node.jobs.handle(start(kib=600))  # 600 KiB: more than one piece of 256 KiB
    done = await node.ended("j1", TrainingState.FINISHED)
    wanted = next(f for f in done.results if f.filename == "adapter_model.safetensors")
    held = b""
    while True:
        node.jobs.handle(TrainingFetch("j1", wanted.filename, len(held), 256 * 1024))
        piece = node.sent[-1]
        assert isinstance(piece, TrainingPiece) and not piece.error and piece.offset == len(held)
        assert len(piece.data) <= 256 * 1024
        if not piece.data:
            break
        held += piece.data
    assert hashlib.sha256(held).hexdigest() == wanted.sha256 and len(held) == wanted.size
    node.jobs.handle(TrainingFetch("j1", wanted.filename, -5))
    bad = node.sent[-1]
    assert isinstance(bad, TrainingPiece) and "from byte -5" in bad.error and not bad.data
    node.jobs.handle(TrainingFetch("j1", "../pairs.jsonl", 0))
    refused = node.sent[-1]
    assert isinstance(refused, TrainingPiece) and "no file '../pairs.jsonl'" in refused.error
    node.jobs.handle(TrainingCollected("j1"))
    assert not (tmp_path / "training/j1").exists()
    node.jobs.handle(TrainingFetch("j1", wanted.filename, 0))
    gone = node.sent[-1]
    assert isinstance(gone, TrainingPiece) and "node node1 has no file" in gone.error and not gone.data


async def test_every_job_held_is_reported_again_after_a_registration(node: Node) -> None:
    node.jobs.handle(start("j1", steps=1))
    await node.ended("j1", TrainingState.FINISHED)
    node.jobs.handle(start("j2", hang=True))
    await eventually(lambda: node.last("j2").state is TrainingState.TRAINING)
    node.sent.clear()
    node.jobs.resend()
    assert {(s.job_id, s.state) for s in node.sent if isinstance(s, TrainingStatus)} == {
        ("j1", TrainingState.FINISHED),
        ("j2", TrainingState.TRAINING),
    }


async def test_a_new_attempt_of_an_ended_job_runs_afresh(node: Node) -> None:
    node.jobs.handle(start(fail=True))
    await node.ended("j1", TrainingState.FAILED)
    node.jobs.handle(start(attempt=2, steps=1))
    await eventually(lambda: node.last("j1").attempt == 2 and node.last("j1").state is TrainingState.FINISHED)
    assert node.prepared == ["j1/1", "j1/2"]


async def test_the_session_hands_training_commands_to_the_jobs_and_sends_their_statuses_up(
    node: Node, tmp_path: Path
) -> None:
    agent, control = memory_pair("node1")

    async def connect(target: str) -> AgentChannel:
        return agent

    async def prepare(*args: object) -> None:
        raise AssertionError("no shard is started here")

    session = AgentSession(
        NodeInventory("node1", "127.0.0.1", 2, 4096),
        ShardSupervisor(tmp_path / "shards", ShardSettings(), prepare),  # type: ignore[arg-type]
        ["cp1:8443"],
        connect,
        on_training=lambda message: node.jobs.handle(message),
    )
    node.jobs = TrainingJobs("node1", tmp_path, node.prepare, session.send)
    running = asyncio.create_task(session.run())
    link = control_link(control)
    try:
        assert isinstance(await link.receive(), NodeRegistration)
        await link.send(Registered(leader="cp1", control_planes=("cp1:8443",)))
        await link.send(start(steps=2))
        states = []
        async with asyncio.timeout(15):
            while not states or states[-1] is not TrainingState.FINISHED:
                message = await link.receive()
                if isinstance(message, TrainingStatus):
                    states.append(message.state)
        assert states[0] is TrainingState.PREPARING and TrainingState.TRAINING in states
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
