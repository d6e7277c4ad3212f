"""The reconciler places an environment's entry, never its members, on its members' demand."""

from __future__ import annotations

from llmgw.testing.comfyui_models import comfyui_model

from .test_reconciling import Harness, harness, receive

__all__ = ["harness"]
A, B = "a" * 64, "b" * 64


async def add(h: Harness, definition: dict[str, object]) -> None:
    await h.store.models.add(str(definition["name"]), definition)


async def test_two_members_get_one_replica_of_their_entry_which_stops_after_the_longest_idle(
    harness: Harness,
) -> None:
    for name, sha, idle in (("flux", A, 60), ("sf3d", B, 600)):
        lazy = {"replicas": {"min": 0}, "on_demand": True, "idle_timeout_s": idle}
        await add(
            harness, comfyui_model(name, sha, filename=f"{name}.safetensors", environment="pics", **lazy)
        )
    agent = await harness.connect("node1")
    await receive(agent, "registered")
    await harness.reconciler.pass_once()
    assert await harness.store.replicas.list() == []
    harness.reconciler.demand("flux")  # a request for a member wants the entry
    await harness.reconciler.pass_once()
    start = (await receive(agent, "start")).start
    assert start.model == "comfyui-env-pics"
    assert [r.model for r in await harness.store.replicas.list()] == ["comfyui-env-pics"]
    harness.reconciler.demand("sf3d")  # the sibling is served by the same replica
    await harness.reconciler.pass_once()
    assert len(await harness.store.replicas.list()) == 1
    await harness.clock.advance(300)  # past flux's idle timeout, within the entry's (sf3d's)
    await harness.reconciler.pass_once()
    assert len(await harness.store.replicas.list()) == 1
    await harness.clock.advance(601)
    await harness.reconciler.pass_once()
    assert (await receive(agent, "stop")).stop.replica_id == start.replica_id
    assert await harness.store.replicas.list() == []


async def test_an_entry_asks_for_the_most_memory_any_member_needs(harness: Harness) -> None:
    await add(harness, comfyui_model("small", A, filename="s.safetensors", environment="e", memory_mb=1000))
    await add(harness, comfyui_model("big", B, filename="b.safetensors", environment="e", memory_mb=6000))
    agent = await harness.connect("node1", memory_mb=8192)
    await receive(agent, "registered")
    await harness.reconciler.pass_once()
    (record,) = await harness.store.replicas.list()
    assert (record.model, record.memory_mb) == ("comfyui-env-e", 6000)


async def test_members_whose_files_clash_are_not_placed_and_say_why(harness: Harness) -> None:
    await add(harness, comfyui_model("one", A, environment="e"))
    await add(harness, comfyui_model("two", B, environment="e"))
    agent = await harness.connect("node1")
    await receive(agent, "registered")
    await harness.reconciler.pass_once()
    assert await harness.store.replicas.list() == []
    assert "model.safetensors" in harness.reconciler.unplaced["comfyui-env-e"]


async def test_the_entry_is_stored_once_and_goes_with_its_last_member(harness: Harness) -> None:
    await add(harness, comfyui_model("one", A, environment="e"))
    agent = await harness.connect("node1")
    await receive(agent, "registered")
    await harness.reconciler.pass_once()
    start = (await receive(agent, "start")).start
    stored = await harness.store.models.get("comfyui-env-e")
    await harness.reconciler.pass_once()
    assert (await harness.store.models.get("comfyui-env-e")).updated_at == stored.updated_at
    await harness.store.models.remove("one")
    await harness.reconciler.pass_once()
    assert [m.name for m in await harness.store.models.list()] == []
    assert (await receive(agent, "stop")).stop.replica_id == start.replica_id
