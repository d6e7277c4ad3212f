"""A replica's custom nodes: cloned over https at a commit; packages beside ComfyUI, never in it."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import pytest

from llmgw.core.comfyui import CustomNode
from llmgw.engines.comfyui_install import uv_binary
from llmgw.engines.comfyui_nodes import clone_node, install_nodes, pins
from llmgw.errors import BuildError
from llmgw.testing.git_https import commit_files, git, publish, serving_git


def node_repository(tmp_path: Path) -> tuple[Path, str, str]:
    """A node's repository with two commits, published as ``served/ComfyUI-Thing.git``."""
    work = tmp_path / "work"
    work.mkdir()
    git("init", "-q", "-b", "main", cwd=work)
    first = commit_files(work, {"__init__.py": "VERSION = 1\n"}, "first")
    second = commit_files(work, {"__init__.py": "VERSION = 2\n"}, "second")
    served = tmp_path / "served"
    served.mkdir()
    publish(work, served / "ComfyUI-Thing.git")
    return served, first, second


async def test_a_node_is_cloned_over_https_at_its_commit_not_its_branchs_head(tmp_path: Path) -> None:
    served, first, second = node_repository(tmp_path)
    async with serving_git(served, tmp_path) as server:
        env = {**os.environ, "GIT_SSL_CAINFO": str(server.ca_file)}
        node = CustomNode(repository=f"{server.url}/ComfyUI-Thing.git", commit=first)
        target = await clone_node(node, tmp_path / "replica" / "custom_nodes", env)
        assert target == tmp_path / "replica" / "custom_nodes" / "ComfyUI-Thing"
        assert (target / "__init__.py").read_text() == "VERSION = 1\n"
        (target / "kept").write_text("")
        assert await clone_node(node, target.parent, env) == target and (target / "kept").exists()
        moved = await clone_node(node.model_copy(update={"commit": second}), target.parent, env)
        assert (moved / "__init__.py").read_text() == "VERSION = 2\n" and not (moved / "kept").exists()


async def test_a_commit_the_repository_lacks_is_refused_and_leaves_no_folder(tmp_path: Path) -> None:
    served, _, _ = node_repository(tmp_path)
    async with serving_git(served, tmp_path) as server:
        env = {**os.environ, "GIT_SSL_CAINFO": str(server.ca_file)}
        node = CustomNode(repository=f"{server.url}/ComfyUI-Thing.git", commit="0" * 40)
        with pytest.raises(BuildError) as caught:
            await clone_node(node, tmp_path / "nodes", env)
        assert "has no commit " + "0" * 40 in str(caught.value)
        assert not (tmp_path / "nodes" / "ComfyUI-Thing").exists()


async def test_a_server_whose_certificate_git_does_not_trust_is_refused(tmp_path: Path) -> None:
    served, first, _ = node_repository(tmp_path)
    async with serving_git(served, tmp_path) as server:
        env = {k: v for k, v in os.environ.items() if k != "GIT_SSL_CAINFO"}
        node = CustomNode(repository=f"{server.url}/ComfyUI-Thing.git", commit=first)
        with pytest.raises(BuildError):
            await clone_node(node, tmp_path / "nodes", env)


def test_pins_are_read_by_canonical_name() -> None:
    text = "# header\nPython_Dateutil==2.9.0.post0\nsix==1.16.0 ; python_version >= '3'\n-e file:///x\n"
    assert pins(text) == {"python-dateutil": "Python_Dateutil==2.9.0.post0", "six": "six==1.16.0"}


def uv(*args: str) -> str:
    return subprocess.run([uv_binary(), *args], capture_output=True, text=True, check=True).stdout


@pytest.mark.e2e
async def test_packages_go_into_the_overlay_at_the_versions_comfyuis_environment_has(tmp_path: Path) -> None:
    venv = tmp_path / "comfyui-venv"
    python = venv / "bin" / "python"
    await asyncio.to_thread(uv, "venv", "--quiet", str(venv))
    await asyncio.to_thread(uv, "pip", "install", "--quiet", "--python", str(python), "six==1.16.0")
    before = await asyncio.to_thread(uv, "pip", "freeze", "--python", str(python))
    served, first, _ = node_repository(tmp_path)
    async with serving_git(served, tmp_path) as server:
        env = {**os.environ, "GIT_SSL_CAINFO": str(server.ca_file)}
        repository = f"{server.url}/ComfyUI-Thing.git"
        node = CustomNode(
            repository=repository, commit=first, packages=("python-dateutil==2.9.0.post0", "six")
        )
        done = await install_nodes([node], tmp_path / "replica", python, env=env)
        assert done.installed == ("python-dateutil==2.9.0.post0",)  # six stays ComfyUI's own 1.16.0
        assert (done.overlay / "dateutil").is_dir() and not (done.overlay / "six.py").exists()
        assert await asyncio.to_thread(uv, "pip", "freeze", "--python", str(python)) == before
        clashing = node.model_copy(update={"packages": ("six>=1.17",)})
        with pytest.raises(BuildError) as caught:
            await install_nodes([clashing], tmp_path / "other", python, env=env)
        assert "fit the versions ComfyUI's environment has" in caught.value.hint
