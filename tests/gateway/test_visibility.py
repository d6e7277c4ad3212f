"""What a key sees: public models and those owned at or above its place; the rest does not exist."""

from __future__ import annotations

import json

import openai
import pytest
from openai import AsyncOpenAI

from llmgw.core.catalog import parse_model
from llmgw.core.tenancy import Owner, Place
from llmgw.gateway import Gateway, KeyEntry, hash_secret
from llmgw.gateway.catalog_view import GatewayCatalog, catalog_entries

from .conftest import MESSAGES, MODEL, MemoryEngine, memory_sdk

CHAT_SECRET = "sk-llmgw-chat-project-key"
SHOP_SECRET = "sk-llmgw-shop-project-key"
SHA = "a" * 64


def catalog_models():  # type: ignore[no-untyped-def]
    return [
        parse_model({"name": MODEL, "source": {"sha256": SHA}}),
        parse_model({"name": "chat-private", "source": {"sha256": SHA}, "owner": "project:acme/ml/chat"}),
        parse_model({"name": "ml-shared", "source": {"sha256": SHA}, "owner": "team:acme/ml"}),
        parse_model(
            {
                "name": "shop-private",
                "source": {"sha256": SHA},
                "owner": "project:acme/web/shop",
                "adapters": [{"name": "shop-tone", "sha256": SHA}],
            }
        ),
        parse_model(
            {
                "name": "base-with-adapter",
                "source": {"sha256": SHA},
                "adapters": [{"name": "chat-tone", "sha256": SHA, "owner": "project:acme/ml/chat"}],
            }
        ),
    ]


@pytest.fixture
def tenants(gateway: Gateway) -> Gateway:
    gateway.feed.catalog_replaced(catalog_models())
    gateway.feed.keys_replaced(
        [
            KeyEntry(
                "k-chat", "chat", hash_secret(CHAT_SECRET), place=Place(Owner.parse("project:acme/ml/chat"))
            ),
            KeyEntry(
                "k-shop", "shop", hash_secret(SHOP_SECRET), place=Place(Owner.parse("project:acme/web/shop"))
            ),
        ]
    )
    return gateway


def sdk(gateway: Gateway, secret: str) -> AsyncOpenAI:
    return memory_sdk(gateway.asgi_app(), secret)


async def test_models_lists_only_what_the_key_sees(tenants: Gateway) -> None:
    async with sdk(tenants, CHAT_SECRET) as chat, sdk(tenants, SHOP_SECRET) as shop:
        chat_sees = sorted(m.id for m in (await chat.models.list()).data)
        shop_sees = sorted(m.id for m in (await shop.models.list()).data)
    assert chat_sees == ["base-with-adapter", "chat-private", "chat-tone", "ml-shared", MODEL]
    assert shop_sees == ["base-with-adapter", "shop-private", "shop-tone", MODEL]


@pytest.mark.parametrize("model", ["shop-private", "shop-tone", "never-defined"])
async def test_another_projects_model_answers_as_one_never_defined(
    tenants: Gateway, engine: MemoryEngine, model: str
) -> None:
    async with sdk(tenants, CHAT_SECRET) as chat:
        with pytest.raises(openai.NotFoundError) as caught:
            await chat.chat.completions.create(model=model, messages=MESSAGES)
        assert caught.value.code == "model_not_found"
        assert caught.value.body == {
            "message": f"The model '{model}' does not exist; GET /v1/models lists the models.",
            "type": "invalid_request_error",
            "param": "model",
            "code": "model_not_found",
        }
        with pytest.raises(openai.NotFoundError):
            await chat.models.retrieve(model)
    assert engine.requests == []


async def test_a_projects_own_and_public_models_are_served(tenants: Gateway, engine: MemoryEngine) -> None:
    tenants.feed.replica_ready(engine.endpoint)
    async with sdk(tenants, SHOP_SECRET) as shop:
        answer = await shop.chat.completions.create(model=MODEL, messages=MESSAGES)
        assert answer.choices[0].message.content == engine.replica_id
        entry = await shop.models.retrieve("shop-private")
    assert entry.owned_by == "project:acme/web/shop"


def test_listings_differ_per_place_and_follow_catalog_changes() -> None:
    catalog = GatewayCatalog(catalog_entries(catalog_models()))
    chat = Place(Owner.parse("project:acme/ml/chat"))
    nowhere = Place()
    names = lambda body: [m["id"] for m in json.loads(body)["data"]]  # noqa: E731
    assert names(catalog.listing(nowhere)) == ["base-with-adapter", MODEL]
    assert "chat-private" in names(catalog.listing(chat))
    catalog.remove("chat-private")
    assert "chat-private" not in names(catalog.listing(chat))
    assert len(names(catalog.listing())) == 6
