"""A ComfyUI replica's gate as the gateway sees it: an aiohttp app speaking the gate's HTTP API.

Each queued workflow's progress is what the test says it is
(:meth:`FakeGate.set`); with ``finish_at_once`` every workflow is done as soon
as it is queued, having saved the files in ``saves``.
"""

from __future__ import annotations

import struct
import uuid
import zlib
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from llmgw.gateway import ReplicaEndpoint
from llmgw.testing.serving import bound_socket

COLOURED_OBJ = b"""# a tetrahedron, one colour per vertex
v 0 0 0 1 0 0
v 1 0 0 0 1 0
v 0 1 0 0 0 1
v 0 0 1 1 1 0
f 1 2 3
f 1 2 4
f 1 3 4
f 2 3 4
"""
"""An OBJ as a mesh node saves it: vertex colours after the coordinates."""


def tiny_png(width: int = 2, height: int = 2, rgb: tuple[int, int, int] = (200, 30, 30)) -> bytes:
    """A real PNG of one colour."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + bytes(rgb) * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


@dataclass
class FakeGate:
    key: str = "gate-key"
    replica_id: str = "g1"
    model: str = "pictures"
    finish_at_once: bool = False
    saves: dict[str, bytes] = field(default_factory=lambda: {"pic_00001_.png": tiny_png()})
    """Files each finished workflow saved (name -> bytes)."""
    refuse: dict[str, Any] | None = None
    """When set, POST /prompt answers 400 with this body (ComfyUI's refusal)."""
    prompts: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Queued workflows by prompt id, in order."""
    progress: dict[str, dict[str, Any]] = field(default_factory=dict)
    deleted: list[str] = field(default_factory=list)
    interrupted: list[str] = field(default_factory=list)
    unauthorised: int = 0
    port: int = 0
    _runner: web.AppRunner | None = None

    @property
    def endpoint(self) -> ReplicaEndpoint:
        return ReplicaEndpoint(
            self.replica_id, self.model, f"http://127.0.0.1:{self.port}", self.key, engine="comfyui"
        )

    def set(self, prompt_id: str, state: str, **fields: Any) -> None:
        """The workflow's progress from now on (``done`` lists ``saves`` as its outputs)."""
        answer = {"prompt_id": prompt_id, "state": state, "ahead": 0, "node": None, "step": 0, "steps": 0}
        answer |= {"percent": 0.0, "error": None, "outputs": []}
        if state == "done":
            answer["outputs"] = [{"filename": name, "subfolder": "", "type": "output"} for name in self.saves]
            answer["percent"] = 100.0
        self.progress[prompt_id] = answer | fields

    async def start(self) -> None:
        app = web.Application(middlewares=[self._auth])
        app.router.add_post("/prompt", self._prompt)
        app.router.add_get("/progress/{prompt_id}", self._progress)
        app.router.add_get("/view", self._view)
        app.router.add_post("/queue", self._queue)
        app.router.add_post("/interrupt", self._interrupt)
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=1.0)
        await self._runner.setup()
        sock = bound_socket()
        self.port = sock.getsockname()[1]
        await web.SockSite(self._runner, sock).start()

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    @web.middleware
    async def _auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if request.headers.get("Authorization") != f"Bearer {self.key}":
            self.unauthorised += 1
            return web.json_response({"error": "wrong key"}, status=401)
        response: web.StreamResponse = await handler(request)
        return response

    async def _prompt(self, request: web.Request) -> web.Response:
        body = await request.json()
        if self.refuse is not None:
            return web.json_response(self.refuse, status=400)
        prompt_id = str(uuid.uuid4())
        self.prompts[prompt_id] = body["prompt"]
        if self.finish_at_once:
            self.set(prompt_id, "done")
        else:
            self.set(prompt_id, "queued", ahead=len(self.prompts) - 1)
        return web.json_response({"prompt_id": prompt_id, "number": len(self.prompts), "node_errors": {}})

    async def _progress(self, request: web.Request) -> web.Response:
        answer = self.progress.get(request.match_info["prompt_id"])
        if answer is None:
            return web.json_response({"error": "unknown prompt"}, status=404)
        return web.json_response(answer)

    async def _view(self, request: web.Request) -> web.Response:
        data = self.saves.get(request.query.get("filename", ""))
        if data is None or request.query.get("type") != "output":
            return web.Response(status=404)
        return web.Response(body=data, content_type="application/octet-stream")

    async def _queue(self, request: web.Request) -> web.Response:
        body = await request.json()
        for prompt_id in body.get("delete", ()):
            self.deleted.append(prompt_id)
            if self.progress.get(prompt_id, {}).get("state") == "queued":
                self.set(prompt_id, "failed", error="deleted from the queue")
        return web.json_response({})

    async def _interrupt(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.interrupted.append(body.get("prompt_id", ""))
        return web.json_response({})
