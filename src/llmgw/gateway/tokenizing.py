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
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any

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
        body = json.dumps({"model": request.get("model", endpoint.model), **request}).encode()
        try:
            response = await self.upstream.post(endpoint, "/tokenize", body, request_id)
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
            tokens = json.loads(raw)["tokens"]
        except (ValueError, KeyError, TypeError):
            return None
        if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
            return None
        self._cache[key] = tokens
        if len(self._cache) > self.max_entries:
            self._cache.popitem(last=False)
        return tokens


_TEXT = frozenset({"model", "prompt", "messages"})


def cache_key(model: str, prompt: str, request: dict[str, Any]) -> tuple[str, str, str]:
    """What a prompt's tokens are kept under: the model, the prompt's text and the request's other
    fields for /tokenize (tools, template arguments …) as canonical JSON (empty without any)."""
    rendering = {name: value for name, value in request.items() if name not in _TEXT}
    if not rendering:
        return model, prompt, ""
    return model, prompt, json.dumps(rendering, sort_keys=True, separators=(",", ":"))
