"""A provider model's key is stored sealed in its definition and read back plain."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from llmgw.errors import StoreError
from llmgw.store import Store
from llmgw.store.secretbox import PREFIX, SecretBox

DEFINITION = {"name": "gpt", "provider": {"base_url": "https://api.example.com/v1", "model": "gpt-4o",
                                          "key": "sk-provider-secret"}}  # fmt: skip


async def stored_definitions(store: Store) -> str:
    async with store.engine.connect() as connection:
        rows = await connection.execute(text("SELECT definition FROM models"))
        return " ".join(str(row.definition) for row in rows)


async def test_the_key_is_sealed_at_rest_and_opened_when_read(store_url: str) -> None:
    box = SecretBox(SecretBox.new_key())
    async with await Store.open(store_url, secrets=box) as store:
        added = await store.models.add("gpt", DEFINITION)
        await store.models.put("gpt", DEFINITION)
        raw = await stored_definitions(store)
        assert "sk-provider-secret" not in raw and PREFIX in raw
        assert added.definition["provider"]["key"] == "sk-provider-secret"
        assert (await store.models.get("gpt")).definition["provider"]["key"] == "sk-provider-secret"
        [listed] = await store.models.list()
        assert listed.definition["provider"]["key"] == "sk-provider-secret"


async def test_a_sealed_key_does_not_open_without_the_store_key(store_url: str) -> None:
    async with await Store.open(store_url, secrets=SecretBox(SecretBox.new_key())) as store:
        await store.models.add("gpt", DEFINITION)
    async with await Store.open(store_url) as store:
        with pytest.raises(StoreError, match="store key"):
            await store.models.get("gpt")


async def test_a_model_without_provider_key_is_stored_as_given(store_url: str) -> None:
    async with await Store.open(store_url, secrets=SecretBox(SecretBox.new_key())) as store:
        plain = {"name": "m", "provider": {"base_url": "http://127.0.0.1:1/v1", "model": "m"}}
        await store.models.add("m", plain)
        assert (await store.models.get("m")).definition == plain
