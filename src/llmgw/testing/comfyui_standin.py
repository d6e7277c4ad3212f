"""A stand-in for ComfyUI: its HTTP and websocket API, real PNG and OBJ files, time per sampler step.

Run as ComfyUI's ``main.py`` is (``PY MAIN --listen IP --port P
--base-directory D ...``, the flags of ComfyUI's ``comfy/cli_args.py``; an
unknown one ends it as argparse does). It speaks ComfyUI's routes as its
``server.py`` answers them: ``POST /prompt``, ``GET /prompt``, ``GET
/queue``, ``POST /queue`` (``delete``, ``clear``), ``POST /interrupt`` (all,
or one ``prompt_id``), ``GET /history``, ``GET /history/{id}``, ``GET
/view``, ``GET /object_info`` and ``GET /ws?clientId=ID``, whose messages
(``status``, ``execution_start``, ``execution_cached``, ``progress_state``,
``executing``, ``progress``, ``executed``, ``execution_success``,
``execution_error``, ``execution_interrupted``) have the shapes and the order
ComfyUI :data:`IMITATES` sends, to the prompt's ``client_id`` (to every
socket when it has none); held to ``tests/engines/data/comfyui-0.3.64-*``.

Workflows run one at a time: the nodes the output nodes need, in the order
ComfyUI picks them (``comfy_execution/graph.py``). A node with
a ``steps`` input (KSampler) takes ``LLMGW_STANDIN_COMFY_STEP_S`` seconds
(0.05 by default) per step and reports a ``progress`` message per step; a
class named ``*Sampler`` without steps takes 8. ``SaveImage`` and
``PreviewImage`` write real PNG files (the size of the workflow's latent
image, ``filename_prefix``); ``TripoSRViewer`` (and any ``*Viewer``/
``*SaveMesh``) an OBJ with vertex colours under ``meshsave``. A node of class
``StandinFail`` fails (``execution_error``).

It knows the classes :mod:`llmgw.testing.comfyui_standin_nodes` lists and
those of the custom nodes under ``<base>/custom_nodes`` (loaded as ComfyUI
loads them); a workflow naming any other is refused as ComfyUI refuses it
(400, ``invalid_prompt`` as 0.3.64; ``missing_node_type`` with
``Settings.missing_node_type``), so "a custom node is missing" happens here as on
a node. ``/interrupt`` with a ``prompt_id`` interrupts only that workflow, when
it runs, as ComfyUI does from 0.3.57; ``LLMGW_STANDIN_COMFY_VERSION`` set to an
older release makes it interrupt whatever runs, as those did. ``POST /queue``
``delete`` takes only waiting workflows off; a running one goes on.
"""

from __future__ import annotations

import argparse
import asyncio
import mimetypes
import os
import sys
import time
import uuid
from pathlib import Path

from aiohttp import web
from packaging.version import InvalidVersion, Version

from llmgw.testing.comfyui_standin_nodes import custom_node_classes, is_output
from llmgw.testing.comfyui_standin_run import Runner, Settings

IMITATES = "0.3.64"
"""The ComfyUI release whose messages, records and refusals the stand-in gives
(``tests/engines/data/comfyui-0.3.64-*``, written from that release's code)."""
INTERRUPT_BY_ID = Version("0.3.57")
"""The first ComfyUI release whose ``/interrupt`` reads ``prompt_id`` (PR #9607, 2 September 2025)."""


RUNNER = web.AppKey("runner", Runner)
"""The stand-in's queue and worker, for tests that look inside."""
TASKS = web.AppKey("tasks", list)


def build_app(settings: Settings) -> web.Application:
    runner = Runner(settings)
    routes = web.RouteTableDef()

    @routes.get("/ws")
    async def websocket(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        sid = request.rel_url.query.get("clientId", "") or uuid.uuid4().hex
        runner.sockets[sid] = ws
        try:
            await ws.send_json({"type": "status", "data": {"status": runner.queue_info(), "sid": sid}})
            if runner.client_id == sid and runner.last_node is not None:  # its workflow runs: where
                await ws.send_json({"type": "executing", "data": {"node": runner.last_node}})
            async for _ in ws:
                pass
        finally:
            if runner.sockets.get(sid) is ws:
                del runner.sockets[sid]
        return ws

    @routes.get("/prompt")
    async def get_prompt(request: web.Request) -> web.Response:
        return web.json_response(runner.queue_info())

    @routes.post("/prompt")
    async def post_prompt(request: web.Request) -> web.Response:
        body = await request.json()
        if "prompt" not in body:
            error = {
                "type": "no_prompt",
                "message": "No prompt provided",
                "details": "No prompt provided",
                "extra_info": {},
            }
            return web.json_response({"error": error, "node_errors": {}}, status=400)
        prompt, prompt_id = body["prompt"], str(body.get("prompt_id", uuid.uuid4()))
        problem = runner.validate(prompt)
        if problem is not None:  # refused before inputs are looked at: no node_errors, as ComfyUI
            return web.json_response({"error": problem, "node_errors": {}}, status=400)
        number: int | float = (
            float(body["number"]) if "number" in body else runner.next_number(bool(body.get("front")))
        )
        extra = dict(body.get("extra_data", {}))
        if "client_id" in body:
            extra["client_id"] = body["client_id"]
        runner.put((number, prompt_id, prompt, extra, runner.outputs_of(prompt)))
        return web.json_response({"prompt_id": prompt_id, "number": number, "node_errors": {}})

    @routes.get("/queue")
    async def get_queue(request: web.Request) -> web.Response:
        return web.json_response(
            {
                "queue_running": [list(i) for i in runner.running],
                "queue_pending": [list(i) for i in runner.pending],
            }
        )

    @routes.post("/queue")
    async def post_queue(request: web.Request) -> web.Response:
        body = await request.json()
        if body.get("clear"):
            runner.pending.clear()
            runner.queue_updated()
        for prompt_id in body.get("delete", []):
            runner.delete(prompt_id)
        return web.Response(status=200)

    @routes.post("/interrupt")
    async def post_interrupt(request: web.Request) -> web.Response:
        try:
            body = await request.json()
        except ValueError:
            body = {}
        wanted = body.get("prompt_id") if settings.interrupt_by_id else None
        if not wanted or wanted in runner.running_ids():
            runner.interrupted = True
        return web.Response(status=200)

    @routes.get("/history")
    async def get_history(request: web.Request) -> web.Response:
        return web.json_response(runner.history)

    @routes.get("/history/{prompt_id}")
    async def get_history_of(request: web.Request) -> web.Response:
        prompt_id = request.match_info["prompt_id"]
        found = runner.history.get(prompt_id)
        return web.json_response({prompt_id: found} if found is not None else {})

    @routes.get("/view")
    async def view(request: web.Request) -> web.StreamResponse:
        query = request.rel_url.query
        filename = query.get("filename", "")
        if not filename or filename[0] == "/" or ".." in filename:
            return web.Response(status=400)
        directory = settings.directories.get(query.get("type", "output"))
        if directory is None:
            return web.Response(status=400)
        folder = (directory / query.get("subfolder", "")).resolve()
        if os.path.commonpath((folder, directory.resolve())) != str(directory.resolve()):
            return web.Response(status=403)
        file = folder / os.path.basename(filename)
        if not file.is_file():
            return web.Response(status=404)
        kind = mimetypes.guess_type(file.name)[0] or "application/octet-stream"
        return web.Response(
            body=file.read_bytes(),
            content_type=kind,
            headers={"Content-Disposition": f'filename="{file.name}"'},
        )

    @routes.get("/object_info")
    async def object_info(request: web.Request) -> web.Response:
        return web.json_response(
            {
                name: {
                    "name": name,
                    "display_name": name,
                    "input": {"required": {}},
                    "output": [],
                    "output_node": is_output(name),
                    "category": "llmgw stand-in",
                }
                for name in settings.nodes
            }
        )

    async def start_worker(app: web.Application) -> None:
        app[TASKS] = [asyncio.create_task(runner.work()), asyncio.create_task(runner.publish())]

    async def stop_worker(app: web.Application) -> None:
        for task in app[TASKS]:
            task.cancel()
        for ws in list(runner.sockets.values()):
            await ws.close()

    app = web.Application(client_max_size=64 * 2**20)
    app.add_routes(routes)
    app.on_startup.append(start_worker)
    app.on_shutdown.append(stop_worker)
    app[RUNNER] = runner
    return app


def parser() -> argparse.ArgumentParser:
    parsed = argparse.ArgumentParser(prog="main.py")
    add = parsed.add_argument
    add("--listen", type=str, default="127.0.0.1", metavar="IP", nargs="?", const="0.0.0.0,::")
    add("--port", type=int, default=8188)
    add("--base-directory", type=str, default=None)
    add("--output-directory", type=str, default=None)
    add("--temp-directory", type=str, default=None)
    add("--input-directory", type=str, default=None)
    add("--user-directory", type=str, default=None)
    add("--disable-auto-launch", action="store_true")
    add("--disable-all-custom-nodes", action="store_true")
    add("--cuda-device", type=int, default=None)
    add("--preview-method", type=str, default="none")
    add("--verbose", type=str, default="INFO", nargs="?", const="DEBUG")
    for flag in (
        "--cpu",
        "--lowvram",
        "--normalvram",
        "--highvram",
        "--novram",
        "--gpu-only",
        "--force-fp16",
        "--force-fp32",
        "--dont-print-server",
    ):
        add(flag, action="store_true")
    return parsed


def main(argv: list[str] | None = None) -> int:
    options = parser().parse_args(sys.argv[1:] if argv is None else argv)
    base = Path(options.base_directory or Path.cwd()).resolve()
    chosen = {
        "output": options.output_directory,
        "temp": options.temp_directory,
        "input": options.input_directory,
    }
    directories = {kind: Path(chosen[kind] or base / kind).resolve() for kind in chosen}
    for directory in directories.values():
        directory.mkdir(parents=True, exist_ok=True)
    step_s = float(os.environ.get("LLMGW_STANDIN_COMFY_STEP_S", "0.05"))
    version = os.environ.get("LLMGW_STANDIN_COMFY_VERSION", "")
    try:
        by_id = not version or Version(version) >= INTERRUPT_BY_ID
    except InvalidVersion:
        print(f"error: LLMGW_STANDIN_COMFY_VERSION={version!r} is not a version", file=sys.stderr)
        return 2
    nodes = Settings.nodes
    if not options.disable_all_custom_nodes:
        nodes += tuple(custom_node_classes(base / "custom_nodes", nodes))
    settings = Settings(base, directories, step_s, nodes, interrupt_by_id=by_id)
    host = options.listen.split(",")[0]
    print(
        f"ComfyUI stand-in: base {base}, {step_s} s per step, HF_HOME={os.environ.get('HF_HOME', '')}",
        flush=True,
    )
    print(f"To see the GUI go to: http://{host}:{options.port}", flush=True)
    started = time.monotonic()
    web.run_app(build_app(settings), host=host, port=options.port, print=None, handle_signals=True)
    print(f"ComfyUI stand-in ran {time.monotonic() - started:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
