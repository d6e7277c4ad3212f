"""The server behind the vLLM, SGLang and TensorRT-LLM stand-ins.

One aiohttp app speaking an engine's OpenAI routes, ``/tokenize``, ``/health``
and Prometheus metrics under that engine's real names, serving a
:class:`~llmgw.testing.standin_state.Standin`: its tokens are produced on a
timing model instead of a GPU (``standin_state``), and what it serves beyond
completions (embeddings, rerank, the Responses API) follows its engine's flags
(``standin_tasks``).
"""

from __future__ import annotations

import hmac
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from llmgw.testing.standin_outputs import constrained_text, logprobs_of
from llmgw.testing.standin_state import BlockCache, Standin, StandinSettings, render_chat, tokenize
from llmgw.testing.standin_tasks import add_task_routes

__all__ = [
    "BlockCache",
    "Standin",
    "StandinSettings",
    "build_app",
    "peft_refusal",
    "render_chat",
    "serve",
    "tokenize",
]


def _error(status: int, message: str, kind: str = "BadRequestError") -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind, "code": status}}, status=status)


def build_app(standin: Standin) -> web.Application:
    """The stand-in's routes, guarded by its key the way its engine guards them."""
    s = standin.settings

    @web.middleware
    async def guard(request: web.Request, handler: Any) -> web.StreamResponse:
        if time.monotonic() - standin.started < s.startup_s and request.path != s.metrics_path:
            return _error(503, "model loading", "ServiceUnavailable")
        if s.engine == "vllm":
            guarded = request.path.startswith("/v1")
        elif s.engine == "sglang":  # its utils/auth.py: these prefixes go unasked
            guarded = not request.path.startswith(("/health", "/ready", "/metrics"))
        else:
            guarded = request.path not in ("/health", s.metrics_path)
        if s.api_key and guarded:
            given = request.headers.get("Authorization", "").removeprefix("Bearer ").strip()
            if not hmac.compare_digest(given.encode(), s.api_key.encode()):
                return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)  # type: ignore[no-any-return]

    async def health(request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def models(request: web.Request) -> web.Response:
        data: list[dict[str, Any]] = [
            {"id": s.served_name, "object": "model", "owned_by": s.engine, "max_model_len": s.max_model_len}
        ]
        for name, path in standin.adapters.items():
            data.append({"id": name, "object": "model", "owned_by": s.engine, "root": path,
                         "parent": s.served_name})  # fmt: skip
        return web.json_response({"object": "list", "data": data})

    async def metrics(request: web.Request) -> web.Response:
        if not s.metrics_on:
            return web.Response(status=404, text="Not Found")
        return web.Response(text=standin.metrics_text(), content_type="text/plain")

    def prompt_of(body: dict[str, Any], chat: bool) -> list[int]:
        if chat or "messages" in body:
            tools = body.get("tools")
            return tokenize(
                render_chat(list(body.get("messages") or []), tools if isinstance(tools, list) else None)
            )
        prompt = body.get("prompt", "")
        return tokenize(prompt if isinstance(prompt, str) else " ".join(map(str, prompt)))

    async def tokenize_route(request: web.Request) -> web.Response:
        body = await request.json()
        tokens = prompt_of(body, False)
        return web.json_response({"count": len(tokens), "max_model_len": s.max_model_len, "tokens": tokens})

    async def complete(request: web.Request, chat: bool) -> web.StreamResponse:
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "the body is not JSON")
        model = body.get("model")
        if "chat" not in s.tasks:
            return _error(
                400, f"The model does not support {'Chat Completions' if chat else 'Completions'} API"
            )
        if s.engine == "vllm" and model not in (s.served_name, *standin.adapters):
            return _error(404, f"The model `{model}` does not exist.", "NotFoundError")
        if model in standin.adapters:
            standin.adapters.move_to_end(model)
        prompt = prompt_of(body, chat)
        salt = body.get("cache_salt")
        if salt is not None and s.engine == "vllm":
            if not isinstance(salt, str) or not salt:
                return _error(400, "Parameter 'cache_salt' must be a non-empty string if provided.")
        elif salt is not None and s.engine == "sglang":  # any string, empty included
            if not isinstance(salt, str):
                return _error(400, "cache_salt: Input should be a valid string")
        else:
            salt = ""
        max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 16)
        if len(prompt) + max_tokens > s.max_model_len:
            return _error(400, f"This model's maximum context length is {s.max_model_len} tokens.")
        ident = f"{'chatcmpl' if chat else 'cmpl'}-{os.urandom(8).hex()}"
        kind = "chat.completion" if chat else "text_completion"
        created = int(time.time())
        usage = {"prompt_tokens": len(prompt), "completion_tokens": max_tokens,
                 "total_tokens": len(prompt) + max_tokens}  # fmt: skip

        top = int(body.get("top_logprobs") or 1) if chat and body.get("logprobs") else 0

        def choice(text: str, finish: str | None, stream: bool, pieces: list[str]) -> dict[str, Any]:
            if not chat:
                return {"index": 0, "text": text, "finish_reason": finish, "logprobs": None}
            key = "delta" if stream else "message"
            content: dict[str, Any] = {"role": "assistant", "content": text}
            if stream and finish:
                content = {}
            logprobs = logprobs_of(pieces, top) if top and pieces else None
            return {"index": 0, key: content, "finish_reason": finish, "logprobs": logprobs}

        if not body.get("stream"):
            pieces = [piece async for piece in standin.generate(prompt, max_tokens, salt)]
            constrained = constrained_text(body) if chat else None
            text, finish = (constrained, "stop") if constrained is not None else ("".join(pieces), "length")
            answer = {"id": ident, "object": kind, "created": created, "model": model,
                      "choices": [choice(text, finish, False, pieces)], "usage": usage}  # fmt: skip
            return web.json_response(answer)
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        chunk_kind = "chat.completion.chunk" if chat else "text_completion"

        async def send(payload: dict[str, Any]) -> None:
            await response.write(f"data: {json.dumps(payload)}\n\n".encode())

        async for piece in standin.generate(prompt, max_tokens, salt, stream=True):
            await send({"id": ident, "object": chunk_kind, "created": created, "model": model,
                        "choices": [choice(piece, None, True, [piece])]})  # fmt: skip
        final: dict[str, Any] = {"id": ident, "object": chunk_kind, "created": created, "model": model,
                                 "choices": [choice("", "length", True, [])]}  # fmt: skip
        if (body.get("stream_options") or {}).get("include_usage"):
            final["usage"] = usage
        await send(final)
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def chat_route(request: web.Request) -> web.StreamResponse:
        return await complete(request, True)

    async def completions_route(request: web.Request) -> web.StreamResponse:
        return await complete(request, False)

    async def load_lora(request: web.Request) -> web.Response:
        if not s.runtime_lora:
            return web.Response(status=404, text="Not Found")
        body = await request.json()
        name, path = body.get("lora_name"), body.get("lora_path")
        if not name or not path:
            return _error(400, "Both 'lora_name' and 'lora_path' must be provided.")
        if name in standin.adapters:
            return _error(400, f"The lora adapter '{name}' has already been loaded.")
        if len(standin.adapters) >= s.max_loras:
            return _error(400, f"No free LoRA slot: {s.max_loras} adapters are loaded (--max-loras).")
        if s.lora_paths_checked and (refusal := peft_refusal(str(path))):
            return _error(400, f"Loading lora {name} failed: {refusal}")
        await standin.sleep(s.load_delay_s)
        standin.adapters[name] = str(path)
        standin.lora_loads += 1
        return web.Response(text=f"Success: LoRA adapter '{name}' added successfully.")

    async def unload_lora(request: web.Request) -> web.Response:
        if not s.runtime_lora:
            return web.Response(status=404, text="Not Found")
        name = (await request.json()).get("lora_name")
        if name not in standin.adapters:
            return _error(404, f"The lora adapter '{name}' cannot be found.", "NotFoundError")
        del standin.adapters[name]
        return web.Response(text=f"Success: LoRA adapter '{name}' removed successfully.")

    app = web.Application(middlewares=[guard])
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_get(s.metrics_path, metrics)
    app.router.add_post("/v1/chat/completions", chat_route)
    app.router.add_post("/v1/completions", completions_route)
    if s.engine in ("vllm", "sglang"):
        app.router.add_post("/tokenize", tokenize_route)
    if s.engine == "vllm":
        app.router.add_post("/v1/load_lora_adapter", load_lora)
        app.router.add_post("/v1/unload_lora_adapter", unload_lora)
    add_task_routes(app, standin)
    return app


def peft_refusal(path: str) -> str:
    """Why ``path`` is no PEFT adapter folder vLLM could load (empty when it is one)."""
    folder = Path(path)
    if not folder.is_dir():
        return f"No adapter found for {path}: not a folder"
    if not (folder / "adapter_config.json").is_file():
        return f"No adapter found for {path}: it holds no adapter_config.json"
    if not any(folder.glob("adapter_model.*")):
        return f"No adapter found for {path}: it holds no adapter_model.safetensors"
    return ""


def serve(settings: StandinSettings, on_start: Callable[[Standin], object] | None = None) -> None:
    """Run the stand-in until SIGTERM or SIGINT (as the engine does)."""
    standin = Standin(settings)
    if on_start is not None:
        on_start(standin)
    print(f"INFO: {settings.engine} stand-in serving {settings.served_name} on "
          f"http://{settings.host}:{settings.port}", flush=True)  # fmt: skip
    web.run_app(build_app(standin), host=settings.host, port=settings.port, print=None, access_log=None)
