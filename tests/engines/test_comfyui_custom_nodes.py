"""A ComfyUI replica's custom nodes reach its gate, which installs them in the replica's base directory."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from llmgw.controlplane.nodes.fleet import ReplicaState
from llmgw.controlplane.replicas.shardspecs import shard_spec
from llmgw.core.catalog import parse_model
from llmgw.engines import comfyui
from llmgw.engines.comfyui_files import child_environment
from llmgw.engines.comfyui_gate import custom_nodes
from llmgw.engines.engine import Launch
from llmgw.errors import LlmgwError
from llmgw.protocol.shards import decode_shard_spec, encode_shard_spec
from llmgw.testing.git_https import commit_files, git, publish, serving_git

COMMIT = "a" * 40


def test_a_comfyui_models_custom_nodes_travel_in_its_shard_spec_to_the_gates_command_line() -> None:
    node = {
        "repository": "https://git.example/o/ComfyUI-Thing",
        "commit": COMMIT,
        "packages": ["six==1.16.0"],
    }
    model = parse_model(
        {
            "name": "pictures",
            "source": {"sha256": "b" * 64, "filename": "m.safetensors", "format": "safetensors"},
            "profile": {"engine": "comfyui"},
            "comfyui": {"workflow": "flux-schnell", "outputs": "image", "nodes": [node]},
        }
    )
    replica = ReplicaState(replica_id="r1", model="pictures", node_id="n1", api_key="k")
    spec = decode_shard_spec(encode_shard_spec(shard_spec(replica, model)))
    assert [json.loads(text) for text in spec.comfyui_nodes] == [node]
    launch = Launch(
        weights=Path("w.safetensors"), port=1, api_key="k", model="pictures", key_file=Path("/s/api-key"),
        entry=Path("/opt/ComfyUI/main.py"), comfyui_nodes=spec.comfyui_nodes,
    )  # fmt: skip
    argv = comfyui.ENGINE.command_line(Path("/opt/comfy/bin/python"), launch)
    given = [argv[i + 1] for i, word in enumerate(argv[: argv.index("--")]) if word == "--custom-node"]
    assert [json.loads(text) for text in given] == [node]


async def test_the_gate_clones_the_nodes_at_their_commits_into_the_replicas_base_dir(tmp_path: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    git("init", "-q", "-b", "main", cwd=work)
    first = commit_files(work, {"__init__.py": "VERSION = 1\n"}, "first")
    commit_files(work, {"__init__.py": "VERSION = 2\n"}, "second")
    served = tmp_path / "served"
    served.mkdir()
    publish(work, served / "ComfyUI-Thing.git")
    async with serving_git(served, tmp_path) as server:
        os.environ["GIT_SSL_CAINFO"] = str(server.ca_file)
        try:
            node = {"repository": f"{server.url}/ComfyUI-Thing.git", "commit": first, "packages": []}
            overlay = await custom_nodes([json.dumps(node)], tmp_path / "base", Path("/usr/bin/python3"))
        finally:
            del os.environ["GIT_SSL_CAINFO"]
    assert (tmp_path / "base/custom_nodes/ComfyUI-Thing/__init__.py").read_text() == "VERSION = 1\n"
    assert overlay is None  # no packages: nothing beside ComfyUI's environment


async def test_a_custom_node_that_is_not_one_is_refused_by_the_gate(tmp_path: Path) -> None:
    with pytest.raises(LlmgwError, match="not a custom node"):
        await custom_nodes(
            ['{"repository": "https://git.example/o/n", "commit": "main"}'], tmp_path, Path("p")
        )


def test_the_overlay_goes_first_on_comfyuis_path(tmp_path: Path) -> None:
    env = child_environment(tmp_path, {"PYTHONPATH": "/elsewhere"}, tmp_path / "overlay")
    assert env["PYTHONPATH"].split(os.pathsep) == [str(tmp_path / "overlay"), "/elsewhere"]
    assert "PYTHONPATH" not in child_environment(tmp_path, {})


def test_a_models_hf_repository_is_its_fetched_folder_linked_as_that_repositorys_snapshot(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "weights"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"w")
    launch = Launch(
        weights=folder, port=1, api_key="k", model="mesh", key_file=Path("/s/api-key"),
        entry=Path("/opt/ComfyUI/main.py"), comfyui_hf_repository="stabilityai/TripoSR",
    )  # fmt: skip
    argv = comfyui.ENGINE.command_line(Path("python"), launch)
    assert argv[argv.index("--hf-repo") + 1] == f"stabilityai/TripoSR={folder}"
    one_file = Launch(
        weights=folder / "model.safetensors", port=1, api_key="k", model="mesh", key_file=Path("/s/api-key"),
        entry=Path("/opt/ComfyUI/main.py"), comfyui_hf_repository="stabilityai/TripoSR",
    )  # fmt: skip
    assert "--hf-repo" not in comfyui.ENGINE.command_line(Path("python"), one_file)
