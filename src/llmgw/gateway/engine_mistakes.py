"""Engines' answers to a client's mistake, told apart from their own failures and put in llmgw's words.

llama-server (b11434, ``tools/server``) answers several requests it cannot take
with 500 ``server_error`` (its ``ex_wrapper`` makes any ``std::exception`` a
500): tools that are not an array, a message whose role is not a string, an
embeddings input longer than its batch, an image sent to a model without a
projector. OpenAI's SDKs retry a 500 twice, and the text it carries is the
engine's own (``[json.exception.type_error.302] ...``). :func:`client_mistake`
recognises those messages (and vLLM's) and gives the 400 message and code the
client gets instead; the answers it was written against are recorded in
``tests/engines/data/llamacpp-b11434-client-mistakes.json``.
"""

from __future__ import annotations

import re
from collections.abc import Callable

_JSON_EXCEPTION = re.compile(r"\s*\[json\.exception\.[a-z_]+\.\d+\]\s*")
_BATCH = re.compile(r"input \((\d+) tokens\) is too large to process\. increase the physical batch size")
_BATCH_SIZE = re.compile(r"current batch size: (\d+)")
_CONTEXT = re.compile(
    r"(?:request|input) \((\d+) tokens\) (?:exceeds the available context size|is larger than the max "
    r"context size) \((\d+) tokens\)"
)
_MEDIA = re.compile(r"(image|audio|video) input is not supported")

_REFUSED_AS_IS = (
    "is required",  # 'messages' is required, "prompt" is required
    "Unsupported param: ",
    "Only no echo is supported",
    "Cannot use both json_schema and grammar",
    "requires --jinja flag",
    "Invalid base64 value",
    "Failed to download image",
    "must be an array of objects with 'id' and 'scale'",
    "dry_sequence_breakers must be",
    "input prompt must be a string",
    "is out of vocabulary",  # vLLM: a token id the model does not have
)
"""Pieces of messages (llama.cpp's server sources, vLLM's) that answer the request's own content."""


def _unreadable(message: str) -> tuple[str, str]:
    detail = _JSON_EXCEPTION.sub(" ", message).strip().rstrip(".")
    detail = detail[:1].lower() + detail[1:]
    return (
        f"The engine could not read the request: {detail[:500]}. "
        "Correct that part of the request (its type, per the OpenAI API) and send it again.",
        "invalid_request_body",
    )


def _too_long_for_batch(message: str) -> tuple[str, str]:
    found = _BATCH.search(message)
    size = _BATCH_SIZE.search(message)
    tokens = found.group(1) if found else "more"
    batch = f" ({size.group(1)} tokens)" if size else ""
    return (
        f"An input is {tokens} tokens; the model takes at most its batch{batch} in one input: "
        "send shorter inputs (split the text), or ask an operator to raise the engine's batch "
        "(--ubatch-size and --batch-size in the model's profile args).",
        "input_too_long",
    )


def _over_context(message: str) -> tuple[str, str]:
    found = _CONTEXT.search(message)
    assert found is not None
    return (
        f"The request is {found.group(1)} tokens; the context of one request, the model's ctx_size, is "
        f"{found.group(2)} tokens: "
        "send fewer or shorter messages (or a shorter prompt), and ask for fewer tokens.",
        "context_length_exceeded",
    )


def _media(message: str) -> tuple[str, str]:
    found = _MEDIA.search(message)
    kind = found.group(1) if found else "this"
    return (
        f"The model takes no {kind} input: send text only, or ask a model that takes {kind} "
        "(GET /v1/models lists them).",
        "unsupported_input",
    )


_RULES: tuple[tuple[Callable[[str], bool], Callable[[str], tuple[str, str]]], ...] = (
    (lambda text: "[json.exception." in text or text.startswith("Failed to parse "), _unreadable),
    (lambda text: _BATCH.search(text) is not None, _too_long_for_batch),
    (lambda text: _CONTEXT.search(text) is not None, _over_context),
    (lambda text: _MEDIA.search(text) is not None, _media),
)


def client_mistake(message: str) -> tuple[str, str] | None:
    """llmgw's message and code for an engine's ``message`` answering the client's own mistake;
    None when it tells of anything else (the engine's own failure keeps its status)."""
    for matches, worded in _RULES:
        if matches(message):
            return worded(message)
    for piece in _REFUSED_AS_IS:
        if piece in message:
            return f"The engine refused the request: {message[:500]}", "invalid_request"
    return None
