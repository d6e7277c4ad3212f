"""A training job survives a failover: a second control plane takes over mid-job from the store."""

from __future__ import annotations

from pathlib import Path

from llmgw.core.training import JobState
from llmgw.testing.eventually import eventually
from llmgw.testing.trainingagent import TrainingAgentStandin, script

from .trainingkit import add_job, add_model, open_plane, sha

FILES = {"adapter_model.safetensors": b"lora" * 1000, "adapter_config.json": b'{"r": 8}'}


async def test_a_new_leader_carries_a_job_on_where_the_last_one_left_it(tmp_path: Path) -> None:
    first = await open_plane(tmp_path, "cp1")
    second = await open_plane(tmp_path, "cp2")
    try:
        await add_model(first.store, first.blobs)
        agent = TrainingAgentStandin("n1", statuses=script(4, FILES), files=FILES, hold=3)
        job = await add_job(first.store)
        agent_side, _ = first.connect(agent)
        first.start()

        async def two_steps_in() -> bool:  # mid-job: prepared, two steps of four trained
            return (await second.store.training.get(job.id)).progress.get("step") == 2

        await eventually(two_steps_in, timeout_s=10)
        await first.stop()  # the leader goes: its duties stop, its streams end
        await first.leadership.resign()
        await agent_side.close()
        await second.leadership.round()
        assert second.leadership.serving

        second.start()
        second.connect(agent)  # the agent moves to the new leader and registers there
        await eventually(lambda: len(agent.starts) == 2, timeout_s=10)
        assert [s.attempt for s in agent.starts] == [1, 1]  # sent again, the same attempt: not run twice
        agent.release()

        async def succeeded() -> bool:
            return (await second.store.training.get(job.id)).state is JobState.SUCCEEDED

        await eventually(succeeded, timeout_s=10)
        done = await second.store.training.get(job.id)
        assert done.attempt == 1 and done.progress["step"] == 4
        assert [loss for _, loss in done.progress["losses"]] == [2.0, 1.0, 2.0 / 3, 0.5]
        assert (
            second.blobs.path_of(sha(FILES["adapter_model.safetensors"])).read_bytes()
            == FILES["adapter_model.safetensors"]
        )
        assert list(agent.jobs) == [job.id]
    finally:
        await second.stop()
        await first.store.close()
        await second.store.close()
