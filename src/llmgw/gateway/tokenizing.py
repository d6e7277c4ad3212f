"""A prompt's tokens from a replica's own ``/tokenize``, cached, for KV-block routing.

The router hashes a prompt's tokens as the engine does to find which replica
holds its leading KV blocks; only the engine's tokenizer gives the same
tokens. :class:`Tokenizer` asks a ready replica of the model
(``POST /tokenize`` with the request's ``prompt`` or ``messages`` and what else
changes how the engine renders them: ``tools``, ``chat_template_kwargs``,
``add_generation_prompt`` …) and keeps the answer in a bounded
least-recently-used cache keyed by model, prompt text and those other fields,
so the same messages with tools and without never share tokens. Any failure
(no such route, a timeout, a bad answer) gives None: the router then falls
back to its approximate prefix tree.

An engine whose ``/tokenize`` takes text (llama.cpp: ``tokenize_text``) is
asked to render a chat's messages with ``/apply-template`` first, then to
tokenize that text as it does a request's prompt (special tokens parsed, its
own added): the count its usage gives (33 and 33 for a one-line chat on
SmolLM2, llama.cpp b11434). Usage asks the same of a stream that ended before
the engine's usage (``forwarding.py``).
"""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from llmgw.core.engines import find_engine
from llmgw.errors import EngineError
from llmgw.gateway.replicas import ReplicaEndpoint
from llmgw.gateway.upstream import UpstreamClient


class Tokenizer:
    """Prompt text → the model's tokens, through a replica's /tokenize, with a bounded cache."""

    def __init__(self, upstream: UpstreamClient, max_entries: int = 4096) -> None:
        self.upstream = upstream
        self.max_entries = max_entries
        self._cache: OrderedDict[tuple[str, str, str], list[int]] = OrderedDict()
        self.asked = 0
        """Calls made to replicas (cache misses)."""

    def cached(self, model: str, prompt: str, request: dict[str, Any]) -> list[int] | None:
        """The tokens kept for ``request`` (``prompt`` its text) on ``model``; None when none are."""
        key = cache_key(model, prompt, request)
        tokens = self._cache.get(key)
        if tokens is not None:
            self._cache.move_to_end(key)
        return tokens

    async def tokens(
        self, endpoint: ReplicaEndpoint, prompt: str, request: dict[str, Any], request_id: bytes
    ) -> list[int] | None:
        """The tokens of ``request`` (``{"prompt": ...}`` or ``{"messages": ...}``, with the fields
        that change their rendering) on its model."""
        key = cache_key(endpoint.model, prompt, request)
        known = self._cache.get(key)
        if known is not None:
            self._cache.move_to_end(key)
            return known
        self.asked += 1
        caps = find_engine(endpoint.engine)
        if caps is not None and caps.tokenize_text:
            tokens = await self._of_text(endpoint, request, request_id)
        else:
            body = {"model": request.get("model", endpoint.model), **request}
            tokens = _tokens(await self._ask(endpoint, "/tokenize", body, request_id))
        if tokens is None:
            return None
        self._cache[key] = tokens
        if len(self._cache) > self.max_entries:
            self._cache.popitem(last=False)
        return tokens

    async def _of_text(
        self, endpoint: ReplicaEndpoint, request: dict[str, Any], request_id: bytes
    ) -> list[int] | None:
        """Tokens from an engine whose /tokenize takes text: a chat rendered by /apply-template first."""
        text = request.get("prompt")
        if "messages" in request:
            rendering = {"model": endpoint.model, **request}
            rendered = await self._ask(endpoint, "/apply-template", rendering, request_id)
            text = rendered.get("prompt") if isinstance(rendered, dict) else None
        if not isinstance(text, str):
            return None
        body = {"content": text, "add_special": True, "parse_special": True}
        tokens = _tokens(await self._ask(endpoint, "/tokenize", body, request_id))
        return tokens if tokens or not text else None  # no tokens for some text: a route that ignored it

    async def _ask(
        self, endpoint: ReplicaEndpoint, path: str, body: dict[str, Any], request_id: bytes
    ) -> Any:
        """The JSON a replica answers ``body`` with on ``path``; None on any failure."""
        try:
            response = await self.upstream.post(endpoint, path, json.dumps(body).encode(), request_id)
        except EngineError:
            return None
        try:
            raw = await response.read()
        except EngineError:
            response.close()
            return None
        except BaseException:  # the client left: the engine's connection goes with it
            response.close()
            raise
        response.release()
        if response.status != 200:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            return None


def _tokens(answer: Any) -> list[int] | None:
    """The token ids of a /tokenize answer (``{"tokens": [...]}``); None when it holds none."""
    tokens = answer.get("tokens") if isinstance(answer, dict) else None
    if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
        return None
    return tokens


_TEXT = frozenset({"model", "prompt", "messages"})


def cache_key(model: str, prompt: str, request: dict[str, Any]) -> tuple[str, str, str]:
    """What a prompt's tokens are kept under: the model, the prompt's text and the request's other
    fields for /tokenize (tools, template arguments …) as canonical JSON (empty without any)."""
    rendering = {name: value for name, value in request.items() if name not in _TEXT}
    if not rendering:
        return model, prompt, ""
    return model, prompt, json.dumps(rendering, sort_keys=True, separators=(",", ":"))


PROMPT_COUNT_TIMEOUT_S = 5.0
"""How long the count of an early-ended stream's prompt waits for the engine's tokenizer (then 0)."""


async def prompt_tokens(
    tokenizer: Tokenizer,
    ready: Sequence[ReplicaEndpoint],
    model: str,
    prompt: str,
    request: dict[str, Any],
    request_id: bytes,
) -> list[int] | None:
    """The prompt's tokens (cached; else from one of the ``ready`` replicas' /tokenize); None when
    unknown."""
    known = tokenizer.cached(model, prompt, request)
    if known is not None:
        return known
    ready = [endpoint for endpoint in ready if endpoint.provider is None]  # a provider has no /tokenize
    if not ready:
        return None
    endpoint = ready[len(prompt) % len(ready)]
    return await tokenizer.tokens(endpoint, prompt, {"model": model, **request}, request_id)


async def prompt_count(
    tokenizer: Tokenizer,
    ready: Sequence[ReplicaEndpoint],
    model: str,
    prompt: str,
    request: dict[str, Any],
    request_id: bytes,
) -> int:
    """How many tokens the prompt is, from the engine's tokenizer (a count made before reused); 0 when
    it gives none within :data:`PROMPT_COUNT_TIMEOUT_S`."""
    try:
        async with asyncio.timeout(PROMPT_COUNT_TIMEOUT_S):
            tokens = await prompt_tokens(tokenizer, ready, model, prompt, request, request_id)
    except TimeoutError:
        return 0
    return len(tokens) if tokens else 0
