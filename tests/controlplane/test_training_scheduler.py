"""The training scheduler against a stand-in agent over an in-memory stream: place, follow, collect."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from llmgw.controlplane.replicas.reconciling import Reconciler
from llmgw.core.catalog import parse_model
from llmgw.core.devices import Device
from llmgw.core.telemetry import DeviceSample, ForeignProcess, Telemetry
from llmgw.core.training import JobState
from llmgw.core.trainingplacement import TrainingHold
from llmgw.core.trainingstream import MAX_PIECE_BYTES, TrainingState, TrainingStatus
from llmgw.testing.eventually import eventually
from llmgw.testing.trainingagent import TrainingAgentStandin, results_of, script

from .trainingkit import Plane, add_job, add_model, open_plane, sha

ADAPTER = bytes(range(256)) * (MAX_PIECE_BYTES // 256 + 100)  # more than one piece
CONFIG = b'{"r": 8, "target_modules": ["q_proj"]}'
FILES = {"adapter_model.safetensors": ADAPTER, "adapter_config.json": CONFIG}


@pytest.fixture
async def plane(tmp_path: Path) -> AsyncIterator[Plane]:
    opened = await open_plane(tmp_path)
    await add_model(opened.store, opened.blobs)
    yield opened
    await opened.stop()
    await opened.store.close()


async def state_of(plane: Plane, job_id: str) -> JobState:
    return (await plane.store.training.get(job_id)).state


async def test_a_job_is_placed_trained_and_its_results_collected_into_the_mirror(plane: Plane) -> None:
    agent = TrainingAgentStandin("n1", statuses=script(3, FILES, peak=5 << 20), files=FILES)
    job = await add_job(plane.store)
    plane.connect(agent)
    plane.start()
    await eventually(lambda: _is(plane, job.id, JobState.SUCCEEDED), timeout_s=10)
    done = await plane.store.training.get(job.id)
    assert (done.node_id, done.device, done.attempt) == ("n1", "cpu", 1)
    assert [s.attempt for s in agent.starts] == [1] and agent.starts[0].device == "cpu"
    assert agent.starts[0].weights[0].filename == "model.safetensors"
    losses = [loss for _, loss in done.progress["losses"]]
    assert losses == sorted(losses, reverse=True) and len(losses) == 3  # falls, step by step
    assert done.progress["peak_memory_bytes"] == 5 << 20
    assert done.logs == ["step 1", "step 2", "step 3"]
    for name, data in FILES.items():
        assert plane.blobs.path_of(sha(data)).read_bytes() == data, name
    assert {r["filename"]: r["collected"] for r in done.results} == {n: len(d) for n, d in FILES.items()}
    assert [f.offset for f in agent.fetches if f.filename == "adapter_model.safetensors"] == [
        0,
        MAX_PIECE_BYTES,
    ]
    await eventually(lambda: agent.jobs[job.id].collected)
    assert (await plane.store.blobs.get(sha(ADAPTER))).filename == "adapter_model.safetensors"


async def _is(plane: Plane, job_id: str, state: JobState) -> bool:
    return await state_of(plane, job_id) is state


async def test_collection_resumes_from_what_the_mirror_holds(plane: Plane) -> None:
    partial = plane.blobs.path_for(sha(ADAPTER))
    partial.parent.mkdir(parents=True, exist_ok=True)
    partial.with_name(partial.name + ".partial").write_bytes(ADAPTER[:1000])
    agent = TrainingAgentStandin("n1", statuses=script(1, FILES), files=FILES)
    job = await add_job(plane.store)
    plane.connect(agent)
    plane.start()
    await eventually(lambda: _is(plane, job.id, JobState.SUCCEEDED), timeout_s=10)
    assert next(f.offset for f in agent.fetches if f.filename == "adapter_model.safetensors") == 1000
    assert plane.blobs.path_of(sha(ADAPTER)).read_bytes() == ADAPTER


async def test_bytes_that_do_not_hash_to_the_named_sha256_fail_the_job_and_are_not_kept(plane: Plane) -> None:
    agent = TrainingAgentStandin("n1", statuses=script(1, FILES), files=FILES, corrupt=True)
    job = await add_job(plane.store)
    plane.connect(agent)
    plane.start()
    await eventually(lambda: _is(plane, job.id, JobState.FAILED), timeout_s=10)
    failed = await plane.store.training.get(job.id)
    assert "collecting its results" in failed.error and "sha256" in failed.error
    assert not plane.blobs.has(sha(ADAPTER))


async def test_a_trainer_failure_is_kept_with_its_reason(plane: Plane) -> None:
    failing = [
        TrainingStatus("", 0, TrainingState.FAILED, error="CUDA out of memory: ask for more memory_mb")
    ]
    agent = TrainingAgentStandin("n1", statuses=failing)
    job = await add_job(plane.store)
    plane.connect(agent)
    plane.start()
    await eventually(lambda: _is(plane, job.id, JobState.FAILED), timeout_s=10)
    assert (await plane.store.training.get(job.id)).error == "CUDA out of memory: ask for more memory_mb"


async def test_a_job_that_fits_nowhere_stays_queued_with_every_nodes_reason(plane: Plane) -> None:
    card = Device("nvidia", 0, "NVIDIA L4", 24000, 24000, device_class="l4")
    agent = TrainingAgentStandin("n1", cards=(card,), statuses=script(1, FILES), files=FILES)
    job = await add_job(plane.store, device_kind="card")
    plane.connect(agent)
    await eventually(lambda: "n1" in plane.fleet.nodes)
    sample = DeviceSample(0, memory_total_mb=24000)
    plane.fleet.apply_telemetry(
        "n1", Telemetry(samples=(sample,), foreign=(ForeignProcess(0, 4242, "python3", 2000),))
    )
    plane.start()
    await eventually(lambda: _reasons(plane, job.id))
    queued = await plane.store.training.get(job.id)
    assert queued.state is JobState.QUEUED
    assert queued.reasons == "n1: card 0: a process that is not llmgw's runs on it (python3)"
    assert agent.starts == []
    plane.fleet.apply_telemetry("n1", Telemetry(samples=(sample,)))  # the process let go
    plane.scheduler.wake()
    await eventually(lambda: _is(plane, job.id, JobState.SUCCEEDED), timeout_s=10)
    assert agent.starts[0].device == "0"


async def _reasons(plane: Plane, job_id: str) -> str:
    return (await plane.store.training.get(job_id)).reasons


async def test_a_node_gone_past_the_grace_fails_its_job_or_places_it_again_while_retry_lasts(
    plane: Plane,
) -> None:
    held = TrainingAgentStandin("n1", statuses=script(3, FILES), files=FILES, hold=2)
    once = await add_job(plane.store, node="n1")
    held_side, _ = plane.connect(held)
    plane.start()
    await eventually(lambda: _is(plane, once.id, JobState.TRAINING), timeout_s=10)
    again = await add_job(plane.store, retry=1)  # queued behind: one job at a time per node
    await eventually(lambda: _reasons(plane, again.id))
    assert "trains job" in (await plane.store.training.get(again.id)).reasons
    await held_side.close()  # the node's stream ends
    await eventually(lambda: "n1" not in plane.fleet.nodes)
    plane.scheduler.wake()
    await eventually(lambda: once.id in plane.scheduler.away)
    await plane.clock.advance(31)
    plane.scheduler.wake()
    await eventually(lambda: _is(plane, once.id, JobState.FAILED), timeout_s=10)
    assert "node n1 has been away for over 30 s" in (await plane.store.training.get(once.id)).error
    other = TrainingAgentStandin("n2", statuses=script(1, FILES), files=FILES)
    plane.connect(other)
    await eventually(lambda: _is(plane, again.id, JobState.SUCCEEDED), timeout_s=10)


async def test_cancel_tells_the_node(plane: Plane) -> None:
    agent = TrainingAgentStandin("n1", statuses=script(3, FILES), files=FILES, hold=2)
    job = await add_job(plane.store)
    plane.connect(agent)
    plane.start()
    await eventually(lambda: _is(plane, job.id, JobState.TRAINING), timeout_s=10)
    cancelled = await plane.scheduler.cancel(job.id, "alice")
    assert (cancelled.state, cancelled.error) == (JobState.CANCELLED, "cancelled by alice")
    await eventually(lambda: agent.jobs[job.id].cancelled == "cancelled by alice")


async def test_a_status_for_a_job_the_plane_does_not_know_is_answered_with_a_cancel(plane: Plane) -> None:
    stray = [TrainingStatus("", 0, TrainingState.TRAINING, 1, 3, 1.0)]
    agent = TrainingAgentStandin("n1", statuses=stray, files=FILES)
    plane.connect(agent)
    plane.start()
    await eventually(lambda: "n1" in plane.fleet.nodes)
    agent.jobs["tj_000000000000"] = _standin_job(agent)
    plane.scheduler.receive("n1", TrainingStatus("tj_000000000000", 1, TrainingState.TRAINING, 1, 3, 1.0))
    await eventually(lambda: agent.jobs["tj_000000000000"].cancelled != "")


def _standin_job(agent: TrainingAgentStandin):  # type: ignore[no-untyped-def]
    from llmgw.core.trainingstream import StartTraining
    from llmgw.testing.trainingagent import StandinJob

    start = StartTraining("tj_000000000000", 1, "m", (), "cpu", 1, b"")
    return StandinJob(start, TrainingStatus("tj_000000000000", 1, TrainingState.TRAINING), {})


def test_results_name_their_bytes() -> None:
    (result,) = results_of({"a.gguf": b"abc"})
    assert (result.filename, result.size, result.sha256) == ("a.gguf", 3, sha(b"abc"))


async def test_a_job_finished_without_results_fails_saying_so(plane: Plane) -> None:
    agent = TrainingAgentStandin("n1", statuses=[TrainingStatus("", 0, TrainingState.FINISHED, 1, 1, 0.5)])
    job = await add_job(plane.store)
    plane.connect(agent)
    plane.start()
    await eventually(lambda: _is(plane, job.id, JobState.FAILED), timeout_s=10)
    assert "named no result" in (await plane.store.training.get(job.id)).error


async def test_a_card_a_job_trains_on_is_withheld_from_replica_placement_until_the_job_ends(
    plane: Plane,
) -> None:
    card = Device("nvidia", 0, "NVIDIA L4", 24000, 24000, device_class="l4")
    agent = TrainingAgentStandin("n1", cards=(card,), statuses=script(3, FILES), files=FILES, hold=2)
    job = await add_job(plane.store, device_kind="card")
    plane.connect(agent)
    await eventually(lambda: "n1" in plane.fleet.nodes)
    plane.fleet.apply_telemetry("n1", Telemetry(samples=(DeviceSample(0, memory_total_mb=24000),)))
    reconciler = Reconciler(plane.store, plane.fleet)
    reconciler.training_holds = plane.scheduler.holds
    chat = parse_model(
        {
            "name": "chat",
            "source": {"sha256": "0" * 64, "filename": "chat.gguf"},
            "profile": {"gpu_class": "l4"},
        }
    )
    assert reconciler.decide(chat, []).devices == (0,)
    plane.start()
    await eventually(lambda: _is(plane, job.id, JobState.TRAINING), timeout_s=10)
    assert plane.scheduler.holds() == (TrainingHold(job.id, "n1", "0", 1024),)
    refused = reconciler.decide(chat, [])
    assert not refused.placed
    assert refused.refusals["n1"].endswith(f"; card 0: training job {job.id} trains on it")
    agent.release()
    await eventually(lambda: _is(plane, job.id, JobState.SUCCEEDED), timeout_s=10)
    await eventually(lambda: not plane.scheduler.holds())
    assert reconciler.decide(chat, []).devices == (0,)
