"""The routes the gateway answers, and what each asks of a model.

Every ``/v1`` route is the gateway's, and so is ``/rerank`` (the path Jina and
Cohere clients call, which vLLM and llama.cpp also serve). A forwarded route
reaches only a model serving its task (``profile.serves``); any other model
answers 400 naming what it serves. The ComfyUI routes (pictures, jobs, their
files) are run by the gateway itself on a replica's gate.
"""

from __future__ import annotations

from llmgw.core.engines import Task

ROOT_ROUTES = frozenset({"/rerank"})
"""Gateway routes outside ``/v1``."""

TASK_OF_ROUTE: dict[str, Task] = {
    "/v1/chat/completions": Task.CHAT,
    "/v1/completions": Task.CHAT,
    "/v1/responses": Task.CHAT,
    "/v1/embeddings": Task.EMBEDDINGS,
    "/v1/rerank": Task.RERANK,
    "/rerank": Task.RERANK,
    "/v1/images/generations": Task.IMAGES,
    "/v1/jobs": Task.JOBS,
}
"""Routes answered by a replica, and what the replica must serve."""

WORKFLOW_ROUTES = frozenset({"/v1/images/generations", "/v1/jobs"})
"""Routes run as ComfyUI workflows on a replica's gate (gateway/workflow_routes.py), not forwarded."""

FORWARDED = frozenset(TASK_OF_ROUTE) - WORKFLOW_ROUTES

MESSAGES_ROUTES = frozenset({"/v1/messages"})
"""Anthropic's Messages API: translated to a chat completion for a chat model (messages_api.py)."""

COUNT_TOKENS_ROUTE = "/v1/messages/count_tokens"
"""A Messages request's prompt tokens, counted by its model's tokenizer (``{"input_tokens": N}``)."""

ENGINE_ROUTE = {"/rerank": "/v1/rerank"}
"""Where an engine is asked when it is not the route the client called."""


def gateway_path(path: str) -> bool:
    """Whether ``path`` is the gateway's (``/v1`` and below, ``/rerank``)."""
    return path.startswith("/v1") or path in ROOT_ROUTES
