"""ComfyUI jobs in the store: written by their runner, read by any process, cancelled through the
store, claimed by one process when their runner went silent, forgotten after they ended."""

from __future__ import annotations

from datetime import timedelta

from llmgw.store import Store
from llmgw.testing.clock import FakeClock


async def _job(store: Store, job_id: str = "job-1", runner: str = "cp1/w0/11") -> None:
    await store.jobs.add(
        job_id=job_id,
        key_id="k1",
        owner="project:acme/ml/art",
        model="pictures",
        served_by="pictures",
        graph={"3": {"class_type": "KSampler", "inputs": {}}},
        runner=runner,
        created_at=store.now(),
    )


async def _save(store: Store, runner: str = "cp1/w0/11", **values: object):
    fields = {"state": "running", "progress": {"step": 3, "steps": 20}, "files": [], "replica_id": "r1",
              "prompt_id": "p-1", "ended": False} | values  # fmt: skip
    return await store.jobs.save("job-1", runner, **fields)  # type: ignore[arg-type]


async def test_the_runner_writes_its_job_and_any_process_reads_it_for_its_key(store: Store) -> None:
    await _job(store)
    assert (await _save(store)).kept
    job = await store.jobs.get("job-1", "k1")
    assert job is not None and job.state == "running" and job.prompt_id == "p-1"
    assert job.progress == {"step": 3, "steps": 20} and job.ended_at is None
    assert await store.jobs.get("job-1", "k2") is None, "another key's job does not exist for it"


async def test_a_cancel_asked_anywhere_reaches_the_runner_at_its_next_write(store: Store) -> None:
    await _job(store)
    assert not (await _save(store)).cancel_asked
    assert await store.jobs.ask_cancel("job-1", "k2") is None
    asked = await store.jobs.ask_cancel("job-1", "k1")
    assert asked is not None and asked.cancel_asked
    assert (await _save(store)).cancel_asked


async def test_a_silent_runner_s_job_is_claimed_once_and_its_old_runner_is_refused(
    store: Store, clock: FakeClock
) -> None:
    await _job(store)
    await _save(store)
    await clock.advance(30)
    silent_since = store.now() - timedelta(seconds=10)
    assert [j.id for j in await store.jobs.orphaned(silent_since)] == ["job-1"]
    assert await store.jobs.claim("job-1", "cp2/plane/22", silent_since)
    assert not await store.jobs.claim("job-1", "cp3/plane/33", silent_since), "one claimant wins"
    assert await store.jobs.orphaned(silent_since) == []
    assert not (await _save(store)).kept, "the old runner no longer writes it"
    assert (await _save(store, "cp2/plane/22")).kept


async def test_ended_jobs_are_not_orphans_and_are_forgotten_after_they_are_kept(
    store: Store, clock: FakeClock
) -> None:
    await _job(store)
    await _save(store, state="done", ended=True)
    await clock.advance(60)
    assert await store.jobs.orphaned(store.now()) == []
    assert await store.jobs.ask_cancel("job-1", "k1") is not None
    assert not (await store.jobs.get("job-1")).cancel_asked, "an ended job is not cancelled"  # type: ignore[union-attr]
    assert await store.jobs.delete_ended_before(store.now() - timedelta(seconds=120)) == 0
    assert await store.jobs.delete_ended_before(store.now()) == 1
    assert await store.jobs.get("job-1") is None
