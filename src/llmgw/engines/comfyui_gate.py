"""``llmgw comfyui-gate``: a ComfyUI replica's engine, with ComfyUI as its child on the loopback.

``llmgw comfyui-gate --port P --host H --key-file F --base-dir D
--comfyui-python PY --comfyui-main MAIN [--weights NAME=PATH ...]
[--hf-repo REPO=PATH ...] [--model NAME] [-- COMFYUI-ARGS ...]``

It reads the replica's key from ``F`` (never from its command line), makes
``D`` ComfyUI's base directory (:mod:`llmgw.engines.comfyui_files`), starts
``PY MAIN --listen 127.0.0.1 --port <free> --base-directory D
--disable-auto-launch COMFYUI-ARGS`` (ComfyUI's ``comfy/cli_args.py``
flags) with ``HF_HOME`` and ``HF_HUB_OFFLINE=1``, keeps a websocket to it
under a client id of its own (connecting again whenever it drops), and
answers ``H:P`` (:mod:`llmgw.engines.comfyui_routes`). It ends when ComfyUI
ends, with its exit code; on SIGTERM or SIGINT it stops ComfyUI (SIGTERM,
``--stop-grace-s``, SIGKILL) and ends. ComfyUI is also killed should the gate
itself die (Linux's parent-death signal).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import json
import logging
import os
import signal
import socket
import sys
import uuid
from pathlib import Path

import aiohttp
from aiohttp import web

from llmgw.core.comfyui import CustomNode
from llmgw.engines.comfyui_files import child_environment, parse_pairs, prepare_base, weight_links
from llmgw.engines.comfyui_nodes import install_nodes
from llmgw.engines.comfyui_progress import Progress
from llmgw.engines.comfyui_routes import Upstream, build_app
from llmgw.errors import ConfigError, LlmgwError

log = logging.getLogger("llmgw.comfyui_gate")
RECONNECT_S = (0.2, 5.0)
"""The websocket's reconnection delay: first and largest."""
PR_SET_PDEATHSIG = 1


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def comfyui_command(python: str, main: str, port: int, base: Path, extra: list[str]) -> list[str]:
    """ComfyUI's command line, with the flags of its ``comfy/cli_args.py``."""
    return [
        python, main,
        "--listen", "127.0.0.1",
        "--port", str(port),
        "--base-directory", str(base),
        "--disable-auto-launch",
        *extra,
    ]  # fmt: skip


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL it when the gate ends (Linux); nothing elsewhere."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


async def follow(upstream: Upstream, progress: Progress, client: aiohttp.ClientSession) -> None:
    """Keep the gate's websocket to ComfyUI open for ever, feeding ``progress`` every message."""
    delay = RECONNECT_S[0]
    while True:
        try:
            async with client.ws_connect(
                f"{upstream.url}/ws?clientId={upstream.client_id}", heartbeat=20
            ) as ws:
                upstream.connected, delay = True, RECONNECT_S[0]
                async for frame in ws:
                    if frame.type is aiohttp.WSMsgType.TEXT:
                        with contextlib.suppress(json.JSONDecodeError):
                            progress.message(json.loads(frame.data))
                    elif frame.type in (aiohttp.WSMsgType.ERROR, aiohttp.WSMsgType.CLOSED):
                        break
        except (aiohttp.ClientError, OSError, TimeoutError) as error:
            log.debug("websocket to ComfyUI: %s", error)
        upstream.connected = False
        await asyncio.sleep(delay)
        delay = min(delay * 2, RECONNECT_S[1])


async def stop_child(child: asyncio.subprocess.Process, grace_s: float) -> int:
    """SIGTERM, ``grace_s`` to end, then SIGKILL; its exit code."""
    if child.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            child.terminate()
        try:
            await asyncio.wait_for(child.wait(), grace_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                child.kill()
    return await child.wait()


async def custom_nodes(given: list[str], base: Path, comfyui_python: Path) -> Path | None:
    """The replica's custom nodes cloned into ``base/custom_nodes`` at their commits, their packages
    in ``base/overlay`` (ComfyUI's own environment never changes); the overlay, or None without one."""
    if not given:
        return None
    try:
        nodes = [CustomNode.model_validate_json(text) for text in given]
    except ValueError as error:
        raise LlmgwError(
            f"a --custom-node is not a custom node: {error}",
            'give {"repository": "https://...", "commit": "<40 hex>", "packages": [...]}',
        ) from None
    log.info("installing %d custom nodes into %s", len(nodes), base / "custom_nodes")
    installed = await install_nodes(nodes, base, comfyui_python)
    return installed.overlay if installed.installed else None


async def run(options: argparse.Namespace, key: str, extra: list[str]) -> int:
    base = Path(options.base_dir)
    links = weight_links(parse_pairs(options.weights, "--weights"))
    repos = dict((name, path) for name, path in parse_pairs(options.hf_repo, "--hf-repo"))
    await asyncio.to_thread(prepare_base, base, links, repos)
    overlay = await custom_nodes(options.custom_node, base, Path(options.comfyui_python))
    port = free_port()
    upstream = Upstream(url=f"http://127.0.0.1:{port}", client_id=f"llmgw-gate-{uuid.uuid4().hex}")
    progress = Progress()
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=5)
    async with aiohttp.ClientSession(timeout=timeout) as client:
        runner = web.AppRunner(build_app(key, upstream, client, progress, options.model), access_log=None)
        await runner.setup()
        try:  # the replica's port first: a port taken ends the gate before ComfyUI starts
            await web.TCPSite(runner, options.host, options.port).start()
        except OSError as error:
            await runner.cleanup()
            raise LlmgwError(
                f"cannot listen on {options.host}:{options.port}: {error.strerror}",
                "the agent starts the replica again on another free port",
            ) from None
        try:
            child = await asyncio.create_subprocess_exec(
                *comfyui_command(options.comfyui_python, options.comfyui_main, port, base, extra),
                env=child_environment(base, os.environ, overlay),
                cwd=str(base),
                preexec_fn=_die_with_parent,
            )
        except OSError as error:
            await runner.cleanup()
            raise LlmgwError(
                f"cannot start ComfyUI with {options.comfyui_python}: {error.strerror}",
                "set engines.comfyui.python in agent.yaml to the Python of ComfyUI's environment",
            ) from None
        stopping = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stopping.set)
        follower = asyncio.create_task(follow(upstream, progress, client))
        try:
            ended = asyncio.create_task(child.wait())
            asked = asyncio.create_task(stopping.wait())
            await asyncio.wait({ended, asked}, return_when=asyncio.FIRST_COMPLETED)
            asked.cancel()
            code = await stop_child(child, options.stop_grace_s)
            return 0 if stopping.is_set() else code
        finally:
            follower.cancel()
            await stop_child(child, 0)
            await runner.cleanup()


def parser() -> argparse.ArgumentParser:
    parsed = argparse.ArgumentParser(prog="llmgw comfyui-gate", description=__doc__, allow_abbrev=False)
    add = parsed.add_argument
    add("--host", default="127.0.0.1", help="address the gate answers on")
    add("--port", type=int, required=True, help="the replica's port")
    add("--key-file", required=True, help="a file holding the replica's key on one line")
    add("--base-dir", required=True, help="ComfyUI's base directory for this replica")
    add("--comfyui-python", required=True, help="the Python of ComfyUI's environment")
    add("--comfyui-main", required=True, help="ComfyUI's main.py")
    add(
        "--weights",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="a weights file (KIND/NAME or NAME)",
    )
    add(
        "--hf-repo",
        action="append",
        default=[],
        metavar="REPO=PATH",
        help="a Hugging Face repository's folder",
    )
    add(
        "--custom-node",
        action="append",
        default=[],
        metavar="JSON",
        help='a custom node: {"repository": "https://...", "commit": "<40 hex>", "packages": [...]}',
    )
    add("--model", default="comfyui", help="the model's name on /v1/models")
    add("--stop-grace-s", type=float, default=5.0, help="seconds ComfyUI gets to end after SIGTERM")
    return parsed


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    ours, extra = (argv[: argv.index("--")], argv[argv.index("--") + 1 :]) if "--" in argv else (argv, [])
    options = parser().parse_args(ours)
    options.base_dir = os.path.abspath(options.base_dir)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        key = Path(options.key_file).read_text().strip()
    except OSError as error:
        print(f"error: cannot read the key file {options.key_file}: {error.strerror}", file=sys.stderr)
        return 2
    if not key:
        print(
            f"error: the key file {options.key_file} is empty; the gate never serves unguarded. "
            "Start it through the llmgw agent, which writes the replica's key there.",
            file=sys.stderr,
        )
        return 2
    try:
        return asyncio.run(run(options, key, extra))
    except LlmgwError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2 if isinstance(error, ConfigError) else 1


if __name__ == "__main__":
    sys.exit(main())
