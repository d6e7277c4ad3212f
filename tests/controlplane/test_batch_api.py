"""``/v1/batches`` as the openai SDK calls it: create, retrieve, list, cancel; errors in OpenAI's shape."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import openai
import pytest
from openai import AsyncOpenAI

from llmgw.controlplane.serving.batchbook import StoreBatchBook
from llmgw.core.tenancy import Owner, Place
from llmgw.gateway import Gateway, GatewaySettings, KeyEntry, hash_secret
from llmgw.store import Store
from llmgw.testing.asgi_client import StreamingAsgiTransport

from .test_batching import MemoryBatchFiles

PLACE = "project:acme/ml/chat"
SECRET, OTHER_SECRET = "sk-batch-api", "sk-batch-other"


@pytest.fixture
async def files() -> MemoryBatchFiles:
    files = MemoryBatchFiles()
    line = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions", "body": {"model": "m"}}
    files.inputs[(PLACE, "file-in")] = json.dumps(line).encode()
    return files


@pytest.fixture
async def gateway(tmp_path: Path, files: MemoryBatchFiles) -> AsyncIterator[Gateway]:
    async with await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'store.db'}") as store:
        gw = Gateway(GatewaySettings(), batches=StoreBatchBook(store.batches, files))
        gw.keys.add(KeyEntry("k1", "mine", hash_secret(SECRET), None, Place(Owner.parse(PLACE))))
        other = Place(Owner.parse("project:acme/ml/other"))
        gw.keys.add(KeyEntry("k2", "other", hash_secret(OTHER_SECRET), None, other))
        yield gw
        await gw.close()


def _sdk(gateway: Gateway, secret: str = SECRET) -> AsyncOpenAI:
    url = "http://gateway.test/v1"
    http = httpx.AsyncClient(transport=StreamingAsgiTransport(gateway.asgi_app()), base_url=url)
    return AsyncOpenAI(base_url=url, api_key=secret, max_retries=0, http_client=http)


async def test_the_sdk_creates_retrieves_lists_and_cancels_a_batch(gateway: Gateway) -> None:
    async with _sdk(gateway) as sdk:
        made = await sdk.batches.create(
            input_file_id="file-in",
            endpoint="/v1/chat/completions",
            completion_window="24h",
            metadata={"run": "nightly"},
        )
        assert made.status == "validating" and made.metadata == {"run": "nightly"}
        assert made.request_counts is not None and made.request_counts.total == 0
        again = await sdk.batches.retrieve(made.id)
        assert again.id == made.id and again.input_file_id == "file-in"
        listed = [batch.id async for batch in sdk.batches.list(limit=10)]
        assert listed == [made.id]
        cancelled = await sdk.batches.cancel(made.id)
        assert cancelled.status == "cancelling" and cancelled.cancelling_at is not None


async def test_another_place_s_batch_answers_not_found(gateway: Gateway) -> None:
    async with _sdk(gateway) as mine, _sdk(gateway, OTHER_SECRET) as theirs:
        made = await mine.batches.create(
            input_file_id="file-in", endpoint="/v1/chat/completions", completion_window="24h"
        )
        with pytest.raises(openai.NotFoundError) as missing:
            await theirs.batches.retrieve(made.id)
        assert missing.value.code == "batch_not_found"
        with pytest.raises(openai.NotFoundError):
            await theirs.batches.cancel(made.id)
        assert [b async for b in theirs.batches.list()] == []


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (
            {"input_file_id": "file-in", "endpoint": "/v1/images/generations", "completion_window": "24h"},
            "endpoint",
        ),
        (
            {"input_file_id": "file-in", "endpoint": "/v1/chat/completions", "completion_window": "1h"},
            "completion_window",
        ),
        ({"endpoint": "/v1/chat/completions", "completion_window": "24h"}, "input_file_id"),
        (
            {"input_file_id": "file-unknown", "endpoint": "/v1/chat/completions", "completion_window": "24h"},
            "input_file_id",
        ),
        (
            {
                "input_file_id": "file-in",
                "endpoint": "/v1/chat/completions",
                "completion_window": "24h",
                "metadata": [1],
            },
            "metadata",
        ),
    ],
)
async def test_a_bad_create_is_a_400_naming_the_field(
    gateway: Gateway, body: dict[str, object], param: str
) -> None:
    async with _sdk(gateway) as sdk:
        with pytest.raises(openai.BadRequestError) as refused:
            await sdk.post("/batches", body=body, cast_to=httpx.Response)
    assert refused.value.param == param


async def test_a_list_limit_out_of_bounds_and_an_unknown_route_are_refused(gateway: Gateway) -> None:
    async with _sdk(gateway) as sdk:
        with pytest.raises(openai.BadRequestError):
            await sdk.batches.list(limit=1000)
        with pytest.raises(openai.NotFoundError):
            await sdk.get("/batches/batch_x/results", cast_to=httpx.Response)
        with pytest.raises(openai.APIStatusError) as wrong:
            await sdk.delete("/batches/batch_x", cast_to=httpx.Response)
    assert wrong.value.status_code == 405


async def test_a_gateway_that_keeps_no_batches_says_so() -> None:
    gw = Gateway(GatewaySettings())
    gw.keys.add(KeyEntry("k1", "mine", hash_secret(SECRET), None, Place(Owner.parse(PLACE))))
    async with _sdk(gw) as sdk:
        with pytest.raises(openai.NotFoundError) as missing:
            await sdk.batches.retrieve("batch_x")
    assert "keeps no batches" in missing.value.message
    await gw.close()
