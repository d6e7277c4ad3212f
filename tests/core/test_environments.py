"""Environments: members of one ComfyUI become one hidden entry, placed for them all."""

from __future__ import annotations

from llmgw.core.catalog import ModelDefinition, parse_model
from llmgw.core.devices import Device, NodeInventory
from llmgw.core.environments import expand_environments, served_by
from llmgw.core.eviction import plan_eviction
from llmgw.core.placement import Ask, Placed, place
from llmgw.testing.comfyui_models import NODE_COMMIT, comfyui_model

A, B, C = "a" * 64, "b" * 64, "c" * 64
NODE = {"repository": "https://github.com/o/ComfyUI-Node", "commit": NODE_COMMIT, "packages": ["trimesh"]}


def catalog(*definitions: dict[str, object]) -> dict[str, ModelDefinition]:
    return {d["name"]: parse_model(d) for d in definitions}  # type: ignore[misc]


def test_members_are_replaced_by_one_entry_carrying_their_weights_nodes_and_repositories() -> None:
    models = catalog(
        comfyui_model("flux", A, filename="flux.safetensors", environment="pics", memory_mb=20_000,
                      hf_repository="o/flux", idle_timeout_s=300, on_demand=True, replicas={"min": 0}),
        comfyui_model("sf3d", B, filename="sf3d.safetensors", environment="pics", memory_mb=8_000,
                      nodes=(NODE,), hf_repository="o/sf3d", idle_timeout_s=900, priority=5),
        comfyui_model("alone", C),
    )  # fmt: skip
    expanded = expand_environments(models)
    assert sorted(expanded.placed) == ["alone", "comfyui-env-pics"]
    entry = expanded.placed["comfyui-env-pics"]
    assert expanded.members == {"comfyui-env-pics": ("flux", "sf3d")}
    assert entry.source.sha256 == A and [(f.filename, f.sha256) for f in entry.source.files] == [
        ("sf3d.safetensors", B)
    ]
    assert [p.memory_mb for p in entry.profiles] == [20_000]
    assert (entry.idle_timeout_s, entry.on_demand, entry.priority) == (900, True, 5)
    assert entry.comfyui is not None
    assert entry.comfyui.members == ("flux", "sf3d") and entry.comfyui.hf_repositories == ("o/flux", "o/sf3d")
    assert [n.folder for n in entry.comfyui.nodes] == ["ComfyUI-Node"]
    assert served_by(models.values()) == {"flux": "comfyui-env-pics", "sf3d": "comfyui-env-pics"}


def test_two_different_weights_files_of_one_name_keep_the_environment_unplaced() -> None:
    models = catalog(comfyui_model("one", A, environment="pics"), comfyui_model("two", B, environment="pics"))
    expanded = expand_environments(models)
    assert expanded.placed == {} and "model.safetensors" in expanded.refusals["pics"]


def test_the_same_file_shared_by_members_is_carried_once() -> None:
    models = catalog(comfyui_model("one", A, environment="e"), comfyui_model("two", A, environment="e"))
    assert expand_environments(models).placed["comfyui-env-e"].source.files == ()


def test_a_sibling_never_evicts_the_replica_serving_its_environment() -> None:
    card = Device(
        kind="nvidia", index=0, name="card", memory_mb=24_000, memory_free_mb=24_000, device_class="l4"
    )
    node = NodeInventory("n1", "127.0.0.1", 4, 4000, devices=(card,))
    serving = Placed("comfyui-env-pics", "n1", 20_000, (0,), replica_id="env", priority=0, environment="pics")
    low = Placed("other", "n1", 20_000, (0,), replica_id="low", priority=0)
    ask = [Ask(10_000, gpu_class="l4")]
    unplaced = place("x", 10_000, [node], [serving], gpu_class="l4")
    assert not unplaced.placed
    decision = plan_eviction("x", 10, ask, [node], [serving], unplaced, environment="pics")
    assert decision.evict == () and "serves environment pics" in decision.kept["env"]
    other = plan_eviction(
        "x", 10, ask, [node], [low], place("x", 10_000, [node], [low], gpu_class="l4"), environment="pics"
    )
    assert other.evict == ("low",)
