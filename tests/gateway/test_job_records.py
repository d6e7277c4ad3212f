"""ComfyUI jobs recorded in the store (the control plane's records): two gateways on one store answer for
each other's jobs, a DELETE reaching the other reaches the runner, and the leader's pickup carries on a job
whose process died from its prompt id on the gate, its files then readable through any gateway."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from llmgw.controlplane.serving.filebook import FileSettings, MirrorFileBook
from llmgw.controlplane.serving.jobrecords import FileBookJobFiles, JobPickup, StoreJobRecords
from llmgw.core.catalog import parse_model
from llmgw.core.tenancy import Owner, Place
from llmgw.gateway import Gateway, GatewaySettings, KeyEntry, hash_secret
from llmgw.gateway.catalog_view import catalog_entries
from llmgw.gateway.jobs import JobState, new_job
from llmgw.mirror.blobs import BlobStore
from llmgw.store import Store
from llmgw.testing.asgi_client import StreamingAsgiTransport
from llmgw.testing.clock import FakeClock
from llmgw.testing.comfyui_models import comfyui_model
from llmgw.testing.eventually import eventually

from .conftest import RecordingOutbound
from .fake_gate import FakeGate, tiny_png
from .test_workflow_api import PICTURE_SECTION, PICTURES

SECRET = "sk-llmgw-jobs-0123456789"
PLACE = "project:acme/art/pics"
ORPHAN_S = 10.0


def _gateway(store: Store, mirror: Path, runner: str, gate: FakeGate, hooks: RecordingOutbound) -> Gateway:
    book = MirrorFileBook(store, BlobStore(mirror), settings=FileSettings())
    gateway = Gateway(
        GatewaySettings(job_poll_s=0.01),
        outbound=hooks,
        files=book,
        job_files=FileBookJobFiles(book, 3600),
        jobs=StoreJobRecords(store, runner),
    )
    gateway.keys.replace([KeyEntry("k1", "art", hash_secret(SECRET), None, Place(Owner.parse(PLACE)))])
    model = parse_model(comfyui_model(PICTURES, "a" * 64, comfyui=PICTURE_SECTION))
    gateway.catalog.replace(catalog_entries([model]))
    gateway.feed.replica_ready(gate.endpoint)
    return gateway


def _client(gateway: Gateway) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        transport=StreamingAsgiTransport(gateway.asgi_app()),
        base_url="http://gateway.test",
        headers={"authorization": f"Bearer {SECRET}"},
    )


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def store(tmp_path: Path, clock: FakeClock) -> AsyncIterator[Store]:
    async with await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'store.db'}", clock=clock) as store:
        yield store


@pytest.fixture
async def gate() -> AsyncIterator[FakeGate]:
    made = FakeGate(key="pictures-key", replica_id="p1", model=PICTURES)
    await made.start()
    yield made
    await made.stop()


@pytest.fixture
async def pair(
    store: Store, tmp_path: Path, gate: FakeGate, hooks: RecordingOutbound
) -> AsyncIterator[tuple[Gateway, Gateway]]:
    one = _gateway(store, tmp_path / "mirror", "cp1/plane/1", gate, hooks)
    two = _gateway(store, tmp_path / "mirror", "cp2/plane/2", gate, hooks)
    yield one, two
    await one.close()
    await two.close()


async def _job(client: httpx.AsyncClient, job_id: str) -> dict[str, Any]:
    answer = await client.get(f"/v1/jobs/{job_id}")
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


async def test_a_job_taken_by_one_gateway_is_followed_through_the_other(
    pair: tuple[Gateway, Gateway], gate: FakeGate
) -> None:
    one, two = pair
    async with _client(one) as first, _client(two) as second:
        made = await first.post("/v1/jobs", json={"model": PICTURES, "inputs": {"prompt": "a fox"}})
        assert made.status_code == 202
        job_id = made.json()["id"]
        assert (await _job(second, job_id))["state"] == "queued", "recorded before its 202"
        (prompt_id,) = await eventually(lambda: list(gate.prompts) or None)
        gate.set(prompt_id, "running", node="3", step=2, steps=4, percent=50.0)
        shown = await eventually(
            lambda: _running_at(second, job_id, 2), message="the other gateway shows its progress"
        )
        assert shown["node"] == "3" and shown["steps"] == 4
        gate.set(prompt_id, "done")
        done = await eventually(lambda: _state(second, job_id, "done"))
        (made_file,) = done["files"]
        assert made_file["url"].endswith(f"/v1/files/{made_file['id']}/content")
        picture = await second.get(f"/v1/files/{made_file['id']}/content")
        assert picture.status_code == 200 and picture.content == tiny_png()
        assert picture.headers["content-type"] == "image/png"
        assert (await second.get("/v1/jobs/job-never-made")).status_code == 404


async def test_a_delete_through_the_other_gateway_cancels_the_job_where_it_runs(
    pair: tuple[Gateway, Gateway], gate: FakeGate
) -> None:
    one, two = pair
    async with _client(one) as first, _client(two) as second:
        job_id = (
            await first.post("/v1/jobs", json={"model": PICTURES, "inputs": {"prompt": "a fox"}})
        ).json()["id"]
        (prompt_id,) = await eventually(lambda: list(gate.prompts) or None)
        gate.set(prompt_id, "running", step=1, steps=4)
        await eventually(lambda: _running_at(second, job_id, 1))
        asked = await second.delete(f"/v1/jobs/{job_id}")
        assert asked.status_code == 200
        cancelled = await eventually(lambda: _state(first, job_id, "cancelled"))
        assert "cancelled by its key" in cancelled["error"]
        assert gate.deleted == [prompt_id] and gate.interrupted == [prompt_id]
        # its end is written to the store just after the runner's own view changed
        await eventually(lambda: _state(second, job_id, "cancelled"))


async def test_the_leader_carries_on_a_job_whose_process_died_from_its_prompt_id(
    store: Store, pair: tuple[Gateway, Gateway], gate: FakeGate, clock: FakeClock, hooks: RecordingOutbound
) -> None:
    one, two = pair
    # a process (cp9) took the job, queued it on the gate, wrote it running, and died
    dead = StoreJobRecords(store, "cp9/plane/99")
    job = new_job("k1", PICTURES, {"3": {"class_type": "KSampler", "inputs": {}}}, None, owner=PLACE)  # type: ignore[arg-type]
    await dead.add(job)
    job.prompt_id = await one.gate.queue(gate.endpoint, job.graph)
    job.replica_id, job.state = gate.replica_id, JobState.RUNNING
    gate.set(job.prompt_id, "running", step=1, steps=4)
    assert (await dead.save(job)).kept
    pickup = JobPickup(store, two, "cp2/plane/2", orphan_s=ORPHAN_S, kept_s=3600)
    assert await pickup.pass_once() == [], "not silent long enough yet"
    await clock.advance(ORPHAN_S + 1)
    assert await pickup.pass_once() == [job.job_id]
    assert await pickup.pass_once() == [], "taken once"
    assert not (await dead.save(job)).kept, "the old runner, were it back, no longer writes it"
    async with _client(one) as first:
        await eventually(lambda: _running_at(first, job.job_id, 1))
        gate.set(job.prompt_id, "done")
        done = await eventually(lambda: _state(first, job.job_id, "done"))
        (made_file,) = done["files"]
        assert (await first.get(f"/v1/files/{made_file['id']}/content")).content == tiny_png()
    assert list(gate.prompts) == [job.prompt_id], "followed on the gate, not queued again"
    assert gate.deleted == [] and gate.interrupted == []
    await eventually(lambda: hooks.records)
    assert [(r.key_id, r.model, r.completion_tokens, r.status) for r in hooks.records] == [
        ("k1", PICTURES, 1, 200)
    ]


async def _state(client: httpx.AsyncClient, job_id: str, state: str) -> dict[str, Any] | None:
    job = await _job(client, job_id)
    return job if job["state"] == state else None


async def _running_at(client: httpx.AsyncClient, job_id: str, step: int) -> dict[str, Any] | None:
    job = await _job(client, job_id)
    return job if job["state"] == "running" and job["step"] == step else None


async def test_a_runner_whose_job_was_taken_over_stops_following_it_and_counts_nothing(
    store: Store, pair: tuple[Gateway, Gateway], gate: FakeGate, clock: FakeClock, hooks: RecordingOutbound
) -> None:
    one, _ = pair
    async with _client(one) as first:
        made = await first.post("/v1/jobs", json={"model": PICTURES, "inputs": {"prompt": "a fox"}})
        job_id = made.json()["id"]
        (prompt_id,) = await eventually(lambda: list(gate.prompts) or None)
        gate.set(prompt_id, "running", step=1, steps=4)
        await eventually(lambda: _running_at(first, job_id, 1))
        await clock.advance(ORPHAN_S + 1)  # as if it had stalled: another plane claims it
        assert await store.jobs.claim(job_id, "cp2/plane/2", store.now() - timedelta(seconds=ORPHAN_S))
        gate.set(prompt_id, "running", step=2, steps=4)  # its next write is refused
        job = one.jobs.book.get(job_id, "k1")
        assert job is not None
        await asyncio.wait_for(job.ended.wait(), 5)
    assert job.taken and job.state is JobState.RUNNING
    assert gate.deleted == [] and gate.interrupted == [], "the workflow goes on for the new runner"
    assert hooks.records == [], "its usage is the new runner's to count"
    record = await store.jobs.get(job_id)
    assert record is not None and record.runner == "cp2/plane/2" and record.ended_at is None
