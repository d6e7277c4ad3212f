"""What a request to a model may ask: the fields of OpenAI's shapes, checked before any engine sees them.

The gateway checks each forwarded request's parsed body with :func:`check_request`
(chat completions, completions, embeddings, Responses; other routes pass):
the types and ranges of the fields OpenAI's API defines, and the sizes an
engine is slow at (llama.cpp's ``logit_bias`` handling grows with the square of
its entries; a million of them kept a thread busy for an hour). Fields it does
not know are passed on as they came; a null counts as a field not sent.

The sizes are :class:`RequestBounds`, which an operator sets per model in the
profile's ``request_limits`` (:class:`RequestLimits`); ``max_tokens`` (and
``max_completion_tokens``, ``max_output_tokens``) above the profile's
``ctx_size`` is refused too. A refusal is a :class:`Refusal`: the field
(``messages[2].role``), what was wrong and what to do. Each check reads a
container's size with ``len()`` before it looks inside it, so a body far over
a bound is refused without reading its entries.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict, Field

ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
"""The ``role`` of a chat message."""
TOOL_CHOICES = frozenset({"none", "auto", "required"})
MAX_TOP_LOGPROBS = 20
"""OpenAI's bound on ``top_logprobs`` (and here on a completion's ``logprobs``)."""
MAX_TOKEN_ID = 2**31 - 1
"""The largest token id taken (engines keep them in 32 bits)."""
SEED_RANGE = (-(2**63), 2**63 - 1)


@dataclass(frozen=True, slots=True)
class RequestBounds:
    """The sizes one request to a model may ask (defaults: :class:`RequestLimits`'s)."""

    max_logit_bias: int = 1024
    """Entries of ``logit_bias``."""
    max_stop: int = 16
    """Strings in ``stop``."""
    max_stop_chars: int = 1024
    """Characters of one ``stop`` string."""
    max_messages: int = 4096
    """Chat ``messages`` (and Responses ``input`` items)."""
    max_tools: int = 128
    """Entries of ``tools``."""
    max_n: int = 16
    """``n`` (and a completion's ``best_of``): choices asked at once."""
    max_input_items: int = 2048
    """Items of an embeddings ``input`` (and of a completion's ``prompt`` array)."""
    max_tokens: int = 0
    """The most tokens one request may ask to generate: the model's per-request context; 0: unknown
    (then only what an engine can hold, 2**31 - 1)."""


DEFAULT_BOUNDS = RequestBounds()


class RequestLimits(BaseModel):
    """A profile's ``request_limits``: the sizes a request to the model may ask (docs/openai.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_logit_bias: int = Field(default=DEFAULT_BOUNDS.max_logit_bias, ge=0, le=1_000_000)
    """Entries of ``logit_bias`` (llama.cpp's cost grows with their square: keep it small)."""
    max_stop: int = Field(default=DEFAULT_BOUNDS.max_stop, ge=0, le=10_000)
    """Strings in ``stop``."""
    max_stop_chars: int = Field(default=DEFAULT_BOUNDS.max_stop_chars, ge=1, le=1_000_000)
    """Characters of one ``stop`` string."""
    max_messages: int = Field(default=DEFAULT_BOUNDS.max_messages, ge=1, le=1_000_000)
    """Chat ``messages``, and Responses ``input`` items."""
    max_tools: int = Field(default=DEFAULT_BOUNDS.max_tools, ge=0, le=100_000)
    """Entries of ``tools``."""
    max_n: int = Field(default=DEFAULT_BOUNDS.max_n, ge=1, le=1024)
    """``n`` (and a completion's ``best_of``)."""
    max_input_items: int = Field(default=DEFAULT_BOUNDS.max_input_items, ge=1, le=1_000_000)
    """Items of an embeddings ``input``, and of a completion's ``prompt`` array."""

    def bounds(self, ctx_size: int = 0) -> RequestBounds:
        """These limits, with ``max_tokens`` bounded by the per-request context ``ctx_size`` (0: not)."""
        return RequestBounds(
            self.max_logit_bias,
            self.max_stop,
            self.max_stop_chars,
            self.max_messages,
            self.max_tools,
            self.max_n,
            self.max_input_items,
            max(ctx_size, 0),
        )


class Refusal(NamedTuple):
    """Why a request is refused: the field, what was wrong, and a code as OpenAI's."""

    param: str
    message: str
    code: str = "invalid_value"


class _Refused(Exception):
    def __init__(self, param: str, message: str, code: str = "invalid_value") -> None:
        super().__init__(message)
        self.refusal = Refusal(param, message, code)


# -- the checks of single values -------------------------------------------------------------------

_KINDS: dict[type, str] = {
    str: "a string",
    bool: "a boolean",
    int: "an integer",
    float: "a number",
    list: "an array",
    dict: "an object",
    type(None): "null",
}


def _kind(value: Any) -> str:
    return _KINDS.get(type(value), "a value of another type")


def _shown(value: Any) -> str:
    """``value`` as a message shows it: at most 40 characters."""
    text = repr(value) if type(value) is str else str(value)
    return text if len(text) <= 40 else f"{text[:37]}..."


def _wrong_type(param: str, value: Any, wanted: str) -> _Refused:
    return _Refused(param, f"'{param}' must be {wanted}, not {_kind(value)}.", "invalid_type")


def _integer(value: Any, param: str, low: int, high: int | None, why: str = "") -> None:
    if type(value) is not int:
        if type(value) is float and value.is_integer():
            value = int(value)  # 16.0 is 16 to a JSON reader
        else:
            raise _wrong_type(param, value, "an integer")
    if value < low or (high is not None and value > high):
        span = f"at least {low}" if high is None else f"between {low} and {high}"
        raise _Refused(param, f"'{param}' is {_shown(value)}; it must be {span}{why}.")


def _number(value: Any, param: str, low: float, high: float) -> None:
    kind = type(value)
    if kind is not float and kind is not int:
        raise _wrong_type(param, value, "a number")
    if not (low <= value <= high) or (kind is float and not math.isfinite(value)):
        raise _Refused(
            param, f"'{param}' is {_shown(value)}; it must be a number between {low:g} and {high:g}."
        )


def _boolean(value: Any, param: str) -> None:
    if type(value) is not bool:
        raise _wrong_type(param, value, "a boolean (true or false)")


def _string(value: Any, param: str) -> None:
    if type(value) is not str:
        raise _wrong_type(param, value, "a string")


def _object(value: Any, param: str) -> dict[str, Any]:
    if type(value) is not dict:
        raise _wrong_type(param, value, "an object")
    return value


def _array(value: Any, param: str, most: int, bound: str) -> list[Any]:
    if type(value) is not list:
        raise _wrong_type(param, value, "an array")
    if len(value) > most:
        raise _Refused(
            param,
            f"'{param}' has {len(value)} entries; the model takes at most {most} ({bound} in the "
            "model's request_limits): send fewer, or ask an operator to raise it.",
            "array_above_max_length",
        )
    return value


# -- the checks of fields, each (value, bounds) -> None, raising _Refused ---------------------------

Check = Callable[[Any, RequestBounds], None]


def _ranged(name: str, low: float, high: float) -> Check:
    return lambda value, bounds: _number(value, name, low, high)


def _whole(name: str, low: int, high: int | None) -> Check:
    return lambda value, bounds: _integer(value, name, low, high)


def _flag(name: str) -> Check:
    return lambda value, bounds: _boolean(value, name)


def _text(name: str) -> Check:
    return lambda value, bounds: _string(value, name)


def _dict(name: str) -> Check:
    return lambda value, bounds: (
        None if type(value) is dict else _raise(_wrong_type(name, value, "an object"))
    )


def _raise(error: _Refused) -> None:
    raise error


def _max_tokens(name: str) -> Check:
    def check(value: Any, bounds: RequestBounds) -> None:
        limit = bounds.max_tokens
        why = " (the model's context, its profile's ctx_size): ask for fewer tokens" if limit else ""
        _integer(value, name, 1, limit or MAX_TOKEN_ID, why)

    return check


def _n(name: str) -> Check:
    def check(value: Any, bounds: RequestBounds) -> None:
        _integer(value, name, 1, bounds.max_n, " (max_n in the model's request_limits)")

    return check


def _logit_bias(value: Any, bounds: RequestBounds) -> None:
    bias = _object(value, "logit_bias")
    if len(bias) > bounds.max_logit_bias:  # refused before a single entry is read
        raise _Refused(
            "logit_bias",
            f"'logit_bias' has {len(bias)} entries; the model takes at most {bounds.max_logit_bias} "
            "(max_logit_bias in the model's request_limits): bias fewer tokens.",
            "object_above_max_length",
        )
    for token, weight in bias.items():
        if not (token.isdigit() and token.isascii() and len(token) <= 10 and int(token) <= MAX_TOKEN_ID):
            raise _Refused(
                "logit_bias",
                f"'logit_bias' has the key {_shown(token)}; its keys must be token ids (0, 1, 2, ...).",
            )
        _number(weight, f"logit_bias.{token}", -100, 100)


def _stop(value: Any, bounds: RequestBounds) -> None:
    if type(value) is str:
        _stop_text(value, "stop", bounds)
        return
    if type(value) is not list:
        raise _wrong_type("stop", value, "a string or an array of strings")
    stops = _array(value, "stop", bounds.max_stop, "max_stop")
    for index, text in enumerate(stops):
        _string(text, f"stop[{index}]")
        _stop_text(text, f"stop[{index}]", bounds)


def _stop_text(text: str, param: str, bounds: RequestBounds) -> None:
    if len(text) > bounds.max_stop_chars:
        raise _Refused(
            param,
            f"'{param}' is {len(text)} characters long; a stop string may have at most "
            f"{bounds.max_stop_chars} (max_stop_chars in the model's request_limits).",
            "string_above_max_length",
        )


def _tools(value: Any, bounds: RequestBounds) -> None:
    tools = _array(value, "tools", bounds.max_tools, "max_tools")
    for index, tool in enumerate(tools):
        where = f"tools[{index}]"
        tool = _object(tool, where)
        kind = tool.get("type")
        _string(kind, f"{where}.type")
        function = tool.get("function")
        if kind == "function" and function is not None:
            function = _object(function, f"{where}.function")
            _string(function.get("name"), f"{where}.function.name")
            if function.get("parameters") is not None:
                _object(function["parameters"], f"{where}.function.parameters")
            if function.get("description") is not None:
                _string(function["description"], f"{where}.function.description")


def _tool_choice(value: Any, bounds: RequestBounds) -> None:
    if type(value) is str:
        if value not in TOOL_CHOICES:
            raise _Refused(
                "tool_choice", f"'tool_choice' is {_shown(value)}; it must be none, auto or required."
            )
        return
    if type(value) is not dict:
        raise _wrong_type("tool_choice", value, "a string (none, auto, required) or an object")
    _string(value.get("type"), "tool_choice.type")


def _content(value: Any, param: str) -> None:
    if value is None or type(value) is str:
        return
    if type(value) is not list:
        raise _wrong_type(param, value, "a string, an array of content parts or null")
    for index, part in enumerate(value):
        where = f"{param}[{index}]"
        part = _object(part, where)
        _string(part.get("type"), f"{where}.type")
        if "text" in part:
            _string(part["text"], f"{where}.text")


def _messages(value: Any, bounds: RequestBounds) -> None:
    messages = _array(value, "messages", bounds.max_messages, "max_messages")
    if not messages:
        raise _Refused("messages", "'messages' is empty; send at least one message.", "empty_array")
    for index, message in enumerate(messages):
        _message(message, f"messages[{index}]")


def _message(message: Any, where: str) -> None:
    message = _object(message, where)
    role = message.get("role")
    _string(role, f"{where}.role")
    if role not in ROLES:
        raise _Refused(
            f"{where}.role",
            f"'{where}.role' is {_shown(role)}; it must be one of {', '.join(sorted(ROLES))}.",
        )
    _content(message.get("content"), f"{where}.content")
    for name in ("name", "tool_call_id"):
        if message.get(name) is not None:
            _string(message[name], f"{where}.{name}")
    calls = message.get("tool_calls")
    if calls is not None:
        if type(calls) is not list:
            raise _wrong_type(f"{where}.tool_calls", calls, "an array")
        for number, call in enumerate(calls):
            _object(call, f"{where}.tool_calls[{number}]")


def _format(value: Any, bounds: RequestBounds) -> None:
    _string(_object(value, "response_format").get("type"), "response_format.type")


def _tokens(value: Any, param: str) -> None:
    """A token id, or an array of them."""
    if type(value) is list:
        for index, token in enumerate(value):
            _integer(token, f"{param}[{index}]", 0, MAX_TOKEN_ID)
    else:
        _integer(value, param, 0, MAX_TOKEN_ID)


def _inputs(param: str, empty_refused: bool) -> Check:
    """A string, or an array of strings, token ids or arrays of token ids (embeddings, prompts)."""

    def check(value: Any, bounds: RequestBounds) -> None:
        if type(value) is str:
            if empty_refused and not value:
                raise _Refused(param, f"'{param}' is an empty string; send text to embed.")
            return
        if type(value) is not list:
            raise _wrong_type(param, value, "a string or an array of strings or token ids")
        items = _array(value, param, bounds.max_input_items, "max_input_items")
        if empty_refused and not items:
            raise _Refused(param, f"'{param}' is an empty array; send at least one input.", "empty_array")
        for index, item in enumerate(items):
            if type(item) is str:
                if empty_refused and not item:
                    raise _Refused(f"{param}[{index}]", f"'{param}[{index}]' is an empty string.")
            elif type(item) is list and empty_refused and not item:
                raise _Refused(f"{param}[{index}]", f"'{param}[{index}]' is an empty array of tokens.")
            else:
                _tokens(item, f"{param}[{index}]")

    return check


def _encoding_format(value: Any, bounds: RequestBounds) -> None:
    if value not in ("float", "base64"):
        raise _Refused("encoding_format", "'encoding_format' must be float or base64.")


def _responses_input(value: Any, bounds: RequestBounds) -> None:
    if type(value) is str:
        return
    items = _array(value, "input", bounds.max_messages, "max_messages")
    for index, item in enumerate(items):
        where = f"input[{index}]"
        item = _object(item, where)
        if "type" in item:
            _string(item["type"], f"{where}.type")
        role = item.get("role")
        if role is not None:
            _message(item, where)


_SAMPLING: dict[str, Check] = {
    "temperature": _ranged("temperature", 0, 2),
    "top_p": _ranged("top_p", 0, 1),
    "presence_penalty": _ranged("presence_penalty", -2, 2),
    "frequency_penalty": _ranged("frequency_penalty", -2, 2),
    "seed": _whole("seed", *SEED_RANGE),
    "logit_bias": _logit_bias,
    "stop": _stop,
    "stream": _flag("stream"),
    "stream_options": _dict("stream_options"),
    "user": _text("user"),
    "n": _n("n"),
}

_CHAT: dict[str, Check] = {
    **_SAMPLING,
    "messages": _messages,
    "max_tokens": _max_tokens("max_tokens"),
    "max_completion_tokens": _max_tokens("max_completion_tokens"),
    "logprobs": _flag("logprobs"),
    "top_logprobs": _whole("top_logprobs", 0, MAX_TOP_LOGPROBS),
    "tools": _tools,
    "tool_choice": _tool_choice,
    "parallel_tool_calls": _flag("parallel_tool_calls"),
    "response_format": _format,
}

_COMPLETION: dict[str, Check] = {
    **_SAMPLING,
    "prompt": _inputs("prompt", empty_refused=False),
    "max_tokens": _max_tokens("max_tokens"),
    "logprobs": _whole("logprobs", 0, MAX_TOP_LOGPROBS),
    "best_of": _n("best_of"),
    "echo": _flag("echo"),
    "suffix": _text("suffix"),
}

_EMBEDDINGS: dict[str, Check] = {
    "input": _inputs("input", empty_refused=True),
    "encoding_format": _encoding_format,
    "dimensions": _whole("dimensions", 1, None),
    "user": _text("user"),
}

_RESPONSES: dict[str, Check] = {
    "input": _responses_input,
    "instructions": _text("instructions"),
    "max_output_tokens": _max_tokens("max_output_tokens"),
    "temperature": _SAMPLING["temperature"],
    "top_p": _SAMPLING["top_p"],
    "top_logprobs": _whole("top_logprobs", 0, MAX_TOP_LOGPROBS),
    "tools": _tools,
    "tool_choice": _tool_choice,
    "parallel_tool_calls": _flag("parallel_tool_calls"),
    "stream": _SAMPLING["stream"],
    "store": _flag("store"),
    "previous_response_id": _text("previous_response_id"),
    "user": _SAMPLING["user"],
    "metadata": _dict("metadata"),
}


def _documents(value: Any, bounds: RequestBounds) -> None:
    _array(value, "documents", bounds.max_input_items, "max_input_items")


_RERANK: dict[str, Check] = {
    "query": _text("query"),
    "documents": _documents,
    "top_n": _whole("top_n", 1, None),
    "return_documents": _flag("return_documents"),
}


class _Route(NamedTuple):
    checks: dict[str, Check]
    required: str
    """The field the route cannot do without (empty: none)."""
    what: str


ROUTES: dict[str, _Route] = {
    "/v1/chat/completions": _Route(_CHAT, "messages", "the conversation, an array of messages"),
    "/v1/completions": _Route(_COMPLETION, "prompt", "the text to complete"),
    "/v1/embeddings": _Route(_EMBEDDINGS, "input", "the text to embed"),
    "/v1/responses": _Route(_RESPONSES, "", ""),
    "/v1/rerank": _Route(_RERANK, "documents", "the documents to rank, an array"),
    "/rerank": _Route(_RERANK, "documents", "the documents to rank, an array"),
}
"""The routes whose bodies are checked, with the checks of their fields."""


def check_request(route: str, data: dict[str, Any], bounds: RequestBounds = DEFAULT_BOUNDS) -> Refusal | None:
    """Why the body ``data`` sent to ``route`` is refused, or None when it may go on to the engine."""
    shape = ROUTES.get(route)
    if shape is None:
        return None
    checks = shape.checks
    try:
        for name, value in data.items():
            check = checks.get(name)
            if check is not None and value is not None:
                check(value, bounds)
    except _Refused as refused:
        return refused.refusal
    required = shape.required
    if required and data.get(required) is None:
        return Refusal(required, f"'{required}' is missing: send {shape.what}.", "missing_required_parameter")
    return None
