"""The stand-ins' routes beyond completions: embeddings, rerank and vLLM's Responses API.

What a stand-in serves follows its engine's flags, as the real engine's does:

- vLLM: ``--runner pooling --convert embed`` serves ``/v1/embeddings``;
  ``--runner pooling`` alone (a cross-encoder's own head) serves ``/rerank``,
  ``/v1/rerank`` and ``/v2/rerank``; a generating model answers those with
  400. A generating model serves ``/v1/responses`` (stateless here: a
  ``previous_response_id`` is refused, as vLLM refuses it without its
  response store).
- SGLang: ``--is-embedding`` serves ``/v1/embeddings`` and ``/v1/rerank``.
- TensorRT-LLM: completions only.

Embeddings are deterministic unit vectors made from the input's tokens (the
same text, the same vector; texts sharing words lie close); a rerank scores
each document by the share of the query's tokens it holds.
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any

from aiohttp import web

from llmgw.testing.standin_state import Standin, render_chat, tokenize

EMBEDDING_DIMENSIONS = 16


def embedding(text: str) -> list[float]:
    """A unit vector of the text's tokens, hashed into :data:`EMBEDDING_DIMENSIONS` buckets."""
    vector = [0.0] * EMBEDDING_DIMENSIONS
    for token in tokenize(text):
        vector[token % EMBEDDING_DIMENSIONS] += 1.0
    norm = math.sqrt(sum(v * v for v in vector)) or 1.0
    return [round(v / norm, 6) for v in vector]


def relevance(query: str, document: str) -> float:
    """The share of the query's distinct tokens the document holds."""
    wanted = set(tokenize(query))
    return len(wanted & set(tokenize(document))) / len(wanted) if wanted else 0.0


def _error(status: int, message: str, kind: str = "BadRequestError") -> web.Response:
    return web.json_response({"error": {"message": message, "type": kind, "code": status}}, status=status)


def add_task_routes(app: web.Application, standin: Standin) -> None:
    """Register the embeddings, rerank and (vLLM) Responses routes on a stand-in's app."""
    s = standin.settings

    async def embeddings(request: web.Request) -> web.Response:
        if "embeddings" not in s.tasks:
            return _error(400, "The model does not support Embeddings API")
        body = await request.json()
        given = body.get("input")
        texts = [given] if isinstance(given, str) else list(given or [])
        if not texts or not all(isinstance(t, str) for t in texts):
            return _error(400, "input must be a string or a list of strings")
        tokens = sum(len(tokenize(t)) for t in texts)
        standin.prompt_tokens += tokens
        data = [{"object": "embedding", "index": i, "embedding": embedding(t)} for i, t in enumerate(texts)]
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        return web.json_response({"object": "list", "model": body.get("model"), "data": data, "usage": usage})

    async def rerank(request: web.Request) -> web.Response:
        if "rerank" not in s.tasks:
            return _error(400, "The model does not support Rerank (Score) API")
        body = await request.json()
        query, documents = body.get("query"), body.get("documents")
        if not isinstance(query, str) or not isinstance(documents, list):
            return _error(400, "rerank needs a 'query' string and a 'documents' list")
        scored = [
            {"index": i, "document": {"text": d}, "relevance_score": relevance(query, str(d))}
            for i, d in enumerate(documents)
        ]
        scored.sort(key=lambda result: -float(result["relevance_score"]))  # type: ignore[arg-type]
        if isinstance(body.get("top_n"), int):
            scored = scored[: body["top_n"]]
        tokens = len(tokenize(query)) * max(1, len(documents)) + sum(len(tokenize(str(d))) for d in documents)
        standin.prompt_tokens += tokens
        usage = {"prompt_tokens": tokens, "total_tokens": tokens}
        answer = {
            "id": f"rerank-{os.urandom(6).hex()}",
            "model": body.get("model"),
            "results": scored,
            "usage": usage,
        }
        return web.json_response(answer)

    async def responses(request: web.Request) -> web.StreamResponse:
        if "chat" not in s.tasks:
            return _error(400, "The model does not support Responses API")
        body = await request.json()
        if body.get("previous_response_id"):
            return _error(
                400,
                "`store` must be enabled (VLLM_ENABLE_RESPONSES_API_STORE=1) to use previous_response_id",
            )
        items = body.get("input")
        messages = [{"role": "user", "content": items}] if isinstance(items, str) else list(items or [])
        if body.get("instructions"):
            messages.insert(0, {"role": "system", "content": body["instructions"]})
        prompt = tokenize(render_chat(_as_messages(messages)))
        max_tokens = int(body.get("max_output_tokens") or 16)
        if len(prompt) + max_tokens > s.max_model_len:
            return _error(400, f"This model's maximum context length is {s.max_model_len} tokens.")
        response_id, item_id = f"resp_{os.urandom(16).hex()}", f"msg_{os.urandom(16).hex()}"
        created = int(time.time())
        usage = {"input_tokens": len(prompt), "input_tokens_details": {"cached_tokens": 0},
                 "output_tokens": max_tokens, "output_tokens_details": {"reasoning_tokens": 0},
                 "total_tokens": len(prompt) + max_tokens}  # fmt: skip

        def whole(text: str, status: str) -> dict[str, Any]:
            part: dict[str, Any] = {"type": "output_text", "text": text, "annotations": [], "logprobs": None}
            item = {
                "type": "message",
                "id": item_id,
                "status": "completed",
                "role": "assistant",
                "content": [part],
            }
            done = status == "completed"
            return {
                "id": response_id,
                "object": "response",
                "created_at": created,
                "model": body.get("model"),
                "status": status,
                "output": [item] if done else [],
                "usage": usage if done else None,
            }

        if not body.get("stream"):
            text = "".join([piece async for piece in standin.generate(prompt, max_tokens)])
            return web.json_response(whole(text, "completed"))
        stream = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await stream.prepare(request)
        sequence = 0

        async def event(kind: str, **fields: Any) -> None:
            nonlocal sequence
            data = json.dumps({"type": kind, "sequence_number": sequence, **fields})
            sequence += 1
            await stream.write(f"event: {kind}\ndata: {data}\n\n".encode())

        await event("response.created", response=whole("", "in_progress"))
        await event("response.in_progress", response=whole("", "in_progress"))
        item = {"type": "message", "id": item_id, "status": "in_progress", "role": "assistant", "content": []}
        await event("response.output_item.added", output_index=0, item=item)
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        await event(
            "response.content_part.added", item_id=item_id, output_index=0, content_index=0, part=part
        )
        pieces = []
        async for piece in standin.generate(prompt, max_tokens, stream=True):
            pieces.append(piece)
            await event(
                "response.output_text.delta",
                item_id=item_id,
                output_index=0,
                content_index=0,
                delta=piece,
                logprobs=[],
            )
        done = whole("".join(pieces), "completed")
        text = done["output"][0]["content"][0]
        await event(
            "response.output_text.done",
            item_id=item_id,
            output_index=0,
            content_index=0,
            text=text["text"],
            logprobs=[],
        )
        await event("response.content_part.done", item_id=item_id, output_index=0, content_index=0, part=text)
        await event("response.output_item.done", output_index=0, item=done["output"][0])
        await event("response.completed", response=done)
        await stream.write_eof()
        return stream

    if s.engine == "vllm":
        app.router.add_post("/v1/embeddings", embeddings)
        for path in ("/rerank", "/v1/rerank", "/v2/rerank"):
            app.router.add_post(path, rerank)
        app.router.add_post("/v1/responses", responses)
    elif s.engine == "sglang":
        app.router.add_post("/v1/embeddings", embeddings)
        app.router.add_post("/v1/rerank", rerank)


def _as_messages(items: list[Any]) -> list[dict[str, Any]]:
    """Responses input items as the chat messages a prompt is rendered from."""
    messages = []
    for item in items:
        if not isinstance(item, dict) or item.get("type", "message") != "message":
            continue
        content = item.get("content")
        if isinstance(content, list):
            content = " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        messages.append({"role": item.get("role", "user"), "content": content or ""})
    return messages
