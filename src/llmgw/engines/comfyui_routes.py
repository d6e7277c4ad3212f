"""The gate's HTTP API on a ComfyUI replica's port: the replica's key, and only the routes it needs.

Every route demands ``Authorization: Bearer <replica key>`` (compared in
constant time). What passes on to ComfyUI is queueing (``POST /prompt``, with
the gate's own ``client_id`` put on the workflow), waiting (``GET
/history/{id}``, ``GET /queue``, ``GET /progress/{id}``), fetching (``GET
/view``) and cancelling (``POST /queue`` with ``delete``, and ``POST
/interrupt`` with a ``prompt_id``: interrupted only when ComfyUI's ``/queue``
shows it running, taken off the queue when it waits, so a ComfyUI older than
0.3.57, which interrupts whatever runs, never stops another client's
workflow). The gate answers ``/health``, ``/v1/models`` and ``/metrics``
itself. Anything else is 404 (a path not served) or 405 (a method not
taken), with a message saying what is.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from llmgw.engines.comfyui_progress import Progress

ROUTES = (
    ("POST", "/prompt"),
    ("GET", "/history/{prompt_id}"),
    ("GET", "/view"),
    ("GET", "/queue"),
    ("POST", "/queue"),
    ("POST", "/interrupt"),
    ("GET", "/progress/{prompt_id}"),
    ("GET", "/health"),
    ("GET", "/v1/models"),
    ("GET", "/metrics"),
)
SHOWN = ", ".join(f"{method} {path}" for method, path in ROUTES)
_PASSED_HEADERS = ("Content-Type", "Content-Disposition", "Content-Length")


def _error(status: int, message: str, kind: str = "invalid_request_error") -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind, "code": status}}, status=status)


@dataclass
class Upstream:
    """ComfyUI as the gate reaches it (set once its child listens)."""

    url: str = ""
    client_id: str = ""
    connected: bool = False
    """The gate's websocket to ComfyUI is open."""


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class GateRoutes:
    """The gate's route handlers over ``client``, which reaches ComfyUI at ``upstream.url``."""

    def __init__(
        self, key: str, upstream: Upstream, client: aiohttp.ClientSession, progress: Progress, model: str
    ) -> None:
        self.expected = key.encode()
        self.upstream = upstream
        self.client = client
        self.progress = progress
        self.model = model

    @web.middleware
    async def guard(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        given = request.headers.get("Authorization", "")
        token = given[7:].strip() if given[:7].lower() == "bearer " else ""
        if not hmac.compare_digest(token.encode(), self.expected):
            return _error(
                401,
                "invalid API key: give the replica's key as 'Authorization: Bearer KEY'",
                "authentication_error",
            )
        try:
            return await handler(request)
        except web.HTTPMethodNotAllowed:
            return _error(405, f"{request.method} is not taken on {request.path}; the gate takes {SHOWN}")
        except web.HTTPNotFound:
            return _error(404, f"{request.path} is not served by this ComfyUI gate; it serves {SHOWN}")
        except ValueError as failed:  # JSON ComfyUI should have sent and did not
            return _error(502, f"ComfyUI answered what is not JSON ({failed}); check its log", "bad_gateway")
        except (aiohttp.ClientError, TimeoutError) as failed:
            why = f"ComfyUI is not answering: {failed or type(failed).__name__}; try again shortly"
            return _error(503, why, "service_unavailable")

    async def relay(
        self, request: web.Request, method: str, path: str, body: Any = None
    ) -> web.StreamResponse:
        async with self.client.request(method, self.upstream.url + path, json=body) as answer:
            response = web.StreamResponse(
                status=answer.status,
                headers={h: answer.headers[h] for h in _PASSED_HEADERS if h in answer.headers},
            )
            await response.prepare(request)
            async for chunk in answer.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

    async def read_json(self, request: web.Request) -> dict[str, Any]:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise web.HTTPBadRequest() from None
        if not isinstance(body, dict):
            raise web.HTTPBadRequest()
        return body

    async def post_prompt(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await self.read_json(request)
        except web.HTTPBadRequest:
            return _error(400, 'the body must be a JSON object: {"prompt": {API-format workflow}}')
        if not isinstance(body.get("prompt"), dict):
            return _error(400, 'the body holds no workflow: give {"prompt": {API-format workflow}}')
        body["client_id"] = self.upstream.client_id  # the gate follows every workflow on its own websocket
        async with self.client.post(self.upstream.url + "/prompt", json=body) as answer:
            data = await answer.json(content_type=None)
            if answer.status == 200 and isinstance(data, dict) and isinstance(data.get("prompt_id"), str):
                self.progress.queued(data["prompt_id"])
            return web.json_response(data, status=answer.status)

    async def get_history(self, request: web.Request) -> web.StreamResponse:
        return await self.relay(request, "GET", f"/history/{request.match_info['prompt_id']}")

    async def get_view(self, request: web.Request) -> web.StreamResponse:
        return await self.relay(request, "GET", "/view?" + request.query_string)

    async def get_queue(self, request: web.Request) -> web.StreamResponse:
        return await self.relay(request, "GET", "/queue")

    async def queued(self) -> tuple[set[str], set[str]]:
        """The prompt ids ComfyUI runs and those waiting (``GET /queue``)."""
        async with self.client.get(self.upstream.url + "/queue") as listed:
            queue = await listed.json(content_type=None)
        running, pending = queue.get("queue_running", []), queue.get("queue_pending", [])
        return {item[1] for item in running}, {item[1] for item in pending}

    async def post_queue(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await self.read_json(request)
        except web.HTTPBadRequest:
            return _error(400, 'the body must be a JSON object: {"delete": [prompt ids]}')
        delete = body.get("delete")
        if (
            set(body) != {"delete"}
            or not isinstance(delete, list)
            or not all(isinstance(i, str) for i in delete)
        ):
            return _error(
                400,
                'the gate takes only {"delete": [prompt ids]} here (never "clear": other '
                "clients' workflows wait in the same queue)",
            )
        answer = await self.relay(request, "POST", "/queue", {"delete": delete})
        running, pending = await self.queued()
        for prompt_id in delete:
            if prompt_id not in running | pending:  # ComfyUI deletes only waiting ones; a running one goes on
                self.progress.cancelled(prompt_id)
        return answer

    async def post_interrupt(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await self.read_json(request)
        except web.HTTPBadRequest:
            body = {}
        wanted = body.get("prompt_id")
        if not isinstance(wanted, str) or not wanted:
            return _error(
                400,
                'the gate interrupts one workflow, named: give {"prompt_id": ID} (other clients\' '
                "workflows run on the same ComfyUI)",
            )
        # ComfyUI before 0.3.57 ignores prompt_id and interrupts whatever runs: only the one named
        # running is ever interrupted; one still waiting is taken off the queue instead.
        running, pending = await self.queued()
        if wanted in running:
            async with self.client.post(
                self.upstream.url + "/interrupt", json={"prompt_id": wanted}
            ) as answer:
                if answer.status != 200:
                    return _error(502, f"ComfyUI answered /interrupt with {answer.status}", "bad_gateway")
        elif wanted in pending:
            async with self.client.post(self.upstream.url + "/queue", json={"delete": [wanted]}) as answer:
                if answer.status != 200:
                    return _error(502, f"ComfyUI answered POST /queue with {answer.status}", "bad_gateway")
            self.progress.cancelled(wanted)
        return web.json_response(
            {"prompt_id": wanted, "interrupted": wanted in running, "deleted": wanted in pending}
        )

    async def get_progress(self, request: web.Request) -> web.StreamResponse:
        prompt_id = request.match_info["prompt_id"]
        entry = self.progress.get(prompt_id)
        if entry is None:
            return _error(404, f"no workflow {prompt_id} was queued through this gate; check the prompt_id")
        ahead = 0
        if entry.state not in ("done", "failed"):
            async with self.client.get(self.upstream.url + "/queue") as answer:
                queue = await answer.json(content_type=None)
            running, pending = queue.get("queue_running", []), queue.get("queue_pending", [])
            numbers = {item[1]: item[0] for item in pending}
            if prompt_id in numbers:
                ahead = len(running) + sum(1 for number in numbers.values() if number < numbers[prompt_id])
            elif prompt_id not in {
                item[1] for item in running
            }:  # over: the websocket may have missed its end
                async with self.client.get(self.upstream.url + f"/history/{prompt_id}") as answer:
                    history = await answer.json(content_type=None)
                self.progress.from_history(prompt_id, history.get(prompt_id))
        return web.json_response(entry.view(ahead))

    async def get_health(self, request: web.Request) -> web.StreamResponse:
        if not self.upstream.url:
            return _error(503, "ComfyUI is starting", "service_unavailable")
        async with self.client.get(
            self.upstream.url + "/prompt", timeout=aiohttp.ClientTimeout(total=5)
        ) as answer:
            if answer.status != 200:
                return _error(503, f"ComfyUI answered {answer.status}", "service_unavailable")
        if not self.upstream.connected:
            return _error(503, "the gate's websocket to ComfyUI is not open yet", "service_unavailable")
        return web.json_response({"status": "ok"})

    async def get_models(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(
            {"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": "comfyui"}]}
        )

    async def get_metrics(self, request: web.Request) -> web.StreamResponse:
        async with self.client.get(self.upstream.url + "/queue") as answer:
            queue = await answer.json(content_type=None)
        running, pending = len(queue.get("queue_running", [])), len(queue.get("queue_pending", []))
        text = (
            "# TYPE comfyui_queue_running gauge\n"
            f"comfyui_queue_running {running}\n"
            "# TYPE comfyui_queue_pending gauge\n"
            f"comfyui_queue_pending {pending}\n"
        )
        return web.Response(text=text, content_type="text/plain")


def build_app(
    key: str, upstream: Upstream, client: aiohttp.ClientSession, progress: Progress, model: str
) -> web.Application:
    """The gate's application; ``client`` reaches ComfyUI at ``upstream.url``."""
    gate = GateRoutes(key, upstream, client, progress, model)
    handlers: dict[tuple[str, str], Handler] = {
        ("POST", "/prompt"): gate.post_prompt,
        ("GET", "/history/{prompt_id}"): gate.get_history,
        ("GET", "/view"): gate.get_view,
        ("GET", "/queue"): gate.get_queue,
        ("POST", "/queue"): gate.post_queue,
        ("POST", "/interrupt"): gate.post_interrupt,
        ("GET", "/progress/{prompt_id}"): gate.get_progress,
        ("GET", "/health"): gate.get_health,
        ("GET", "/v1/models"): gate.get_models,
        ("GET", "/metrics"): gate.get_metrics,
    }
    app = web.Application(middlewares=[gate.guard], client_max_size=64 * 2**20)
    for (method, path), handler in handlers.items():
        app.router.add_route(method, path, handler)
    return app
