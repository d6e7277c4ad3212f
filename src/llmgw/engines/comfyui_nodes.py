"""A replica's custom nodes: cloned at their commits, their packages in an overlay of the replica's own.

Each node is cloned over https into the replica's ``custom_nodes/<folder>``
and checked out (detached) at its full commit; one already there at that
commit is kept. The nodes' PyPI packages are resolved against ComfyUI's
environment as it is (``uv pip freeze`` of it, given as ``--constraint``), so a
package ComfyUI has keeps its version; only what the environment lacks is
installed, with ``--no-deps`` (the resolution named every dependency), into
the replica's overlay folder, which goes first on ComfyUI's ``PYTHONPATH``.
ComfyUI's environment is never changed.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from llmgw.core.comfyui import CustomNode
from llmgw.engines.comfyui_install import uv_binary
from llmgw.errors import BuildError

CLONE_TIMEOUT_S = 600.0
INSTALL_TIMEOUT_S = 1800.0
_PIN = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)")


@dataclass(frozen=True)
class NodesInstalled:
    """What a replica's ComfyUI needs to see its custom nodes."""

    custom_nodes: Path
    overlay: Path
    """Goes first on ``PYTHONPATH``: the packages the nodes need that ComfyUI's environment lacks."""
    installed: tuple[str, ...]
    """The ``name==version`` pins put into the overlay."""


def canonical(name: str) -> str:
    """A package name as PyPI compares them (PEP 503)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(text: str) -> dict[str, str]:
    """``name==version`` lines of a freeze or a compiled list, by canonical name."""
    found = {}
    for line in text.splitlines():
        if match := _PIN.match(line.strip()):
            found[canonical(match[1])] = f"{match[1]}=={match[2]}"
    return found


async def _git(args: Sequence[str], env: Mapping[str, str], timeout_s: float = CLONE_TIMEOUT_S) -> str:
    process = await asyncio.create_subprocess_exec(
        "git", *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        stdin=asyncio.subprocess.DEVNULL, env={**env, "GIT_TERMINAL_PROMPT": "0"},
    )  # fmt: skip
    try:
        output, _ = await asyncio.wait_for(process.communicate(), timeout_s)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise BuildError(
            f"git {args[0]} did not finish in {timeout_s:.0f} s", hint="check the network"
        ) from None
    text = output.decode(errors="replace").strip()
    if process.returncode != 0:
        raise BuildError(
            f"git {' '.join(args)} failed: {text[-600:]}", hint="check the repository and commit"
        )
    return text


async def clone_node(node: CustomNode, custom_nodes: Path, env: Mapping[str, str] | None = None) -> Path:
    """``node`` at its commit in ``custom_nodes/<folder>`` (kept when already there at that commit)."""
    env = dict(os.environ if env is None else env)
    target = custom_nodes / node.folder
    if (target / ".git").exists():
        try:
            if await _git(["-C", str(target), "rev-parse", "HEAD"], env) == node.commit:
                return target
        except BuildError:
            pass
    await asyncio.to_thread(_remove, target)
    await asyncio.to_thread(custom_nodes.mkdir, parents=True, exist_ok=True)
    await _git(["clone", "--no-checkout", "--quiet", node.repository, str(target)], env)
    try:
        await _git(
            ["-C", str(target), "-c", "advice.detachedHead=false", "checkout", "--quiet", node.commit], env
        )
    except BuildError as error:
        await asyncio.to_thread(_remove, target)
        raise BuildError(
            f"{node.repository} has no commit {node.commit}: {error}",
            hint="give a commit of the repository (git log shows them); it may have been force-pushed away",
        ) from None
    return target


async def _uv(args: Sequence[str], stdin: bytes = b"", timeout_s: float = INSTALL_TIMEOUT_S) -> str:
    process = await asyncio.create_subprocess_exec(
        uv_binary(), *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        stdin=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        output, errors = await asyncio.wait_for(process.communicate(stdin), timeout_s)
    except TimeoutError:
        process.kill()
        await process.wait()
        raise BuildError(
            f"uv {args[0]} did not finish in {timeout_s:.0f} s", hint="check the network"
        ) from None
    if process.returncode != 0:
        raise BuildError(
            f"uv {' '.join(args[:2])} failed: {errors.decode(errors='replace').strip()[-800:]}",
            hint="a custom node's packages must fit the versions ComfyUI's environment has; "
            "choose versions that do, or another commit of the node",
        )
    return output.decode(errors="replace")


def overlay_command(uv: str, python: Path, overlay: Path, wanted: Sequence[str]) -> list[str]:
    """uv's command putting ``wanted`` (pinned, dependencies already resolved) into ``overlay``."""
    return [uv, "pip", "install", "--python", str(python), "--target", str(overlay), "--no-deps", *wanted]


async def install_nodes(
    nodes: Sequence[CustomNode],
    base_dir: Path,
    comfyui_python: Path,
    *,
    env: Mapping[str, str] | None = None,
) -> NodesInstalled:
    """Clone ``nodes`` into ``base_dir/custom_nodes`` and put their packages into ``base_dir/overlay``."""
    custom_nodes, overlay = base_dir / "custom_nodes", base_dir / "overlay"
    for node in nodes:
        await clone_node(node, custom_nodes, env)
    wanted = [spec for node in nodes for spec in node.packages]
    if not wanted:
        return NodesInstalled(custom_nodes, overlay, ())
    freeze = await _uv(["pip", "freeze", "--python", str(comfyui_python)])
    constraints = base_dir / "constraints.txt"
    constraints.write_text(freeze)
    compiled = await _uv(
        ["pip", "compile", "-", "--python", str(comfyui_python), "--constraint", str(constraints),
         "--no-header", "--no-annotate", "--quiet"],
        "\n".join(wanted).encode(),
    )  # fmt: skip
    have = pins(freeze)
    missing = [pin for name, pin in sorted(pins(compiled).items()) if have.get(name) != pin]
    if missing:
        overlay.mkdir(parents=True, exist_ok=True)
        await _uv(overlay_command("uv", comfyui_python, overlay, missing)[1:])
    return NodesInstalled(custom_nodes, overlay, tuple(missing))


def _remove(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
