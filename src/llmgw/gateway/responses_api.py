"""OpenAI's Responses API (``POST /v1/responses``): served natively or translated to chat completions.

An engine whose row says ``responses_api`` (llama.cpp, vLLM) is sent the
request as a Responses request; any other (SGLang, TensorRT-LLM) is sent a
chat completion made from it, and its answer is made into a Response — whole,
or as the Responses API's typed events in their order (``response.created``,
``response.in_progress``, ``response.output_item.added``,
``response.content_part.added``, ``response.output_text.delta`` …,
``response.completed``), each with its ``sequence_number``.

Either way llmgw, not the engine, keeps conversations: a request naming
``previous_response_id`` is sent with the earlier conversation in its
``input`` (from the gateway's :class:`~llmgw.gateway.response_store.ResponseBook`,
per key and bounded), and every answer the client did not send with
``store: false`` is kept for a follow-up — before the client is sent its
last bytes (a whole answer, or a stream's ``response.completed``), so a
follow-up sent the moment the client has it finds it. Engines are always
told ``store: false``.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import Sequence
from typing import Any

from llmgw.errors import LlmgwError
from llmgw.gateway.api_errors import ApiError
from llmgw.gateway.response_store import ResponseBook
from llmgw.gateway.responses_events import (
    ChatToResponseEvents,
    NativeEventWatcher,
    response_object,
    responses_usage,
)

CHAT_FIELDS = ("temperature", "top_p", "parallel_tool_calls", "user", "seed")
"""Responses request fields a chat completion takes as they are."""
UNTRANSLATED = ("background", "conversation", "prompt")
"""Responses request fields a chat completion cannot carry: refused for a translated engine."""

log = logging.getLogger(__name__)


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(16)}"


def _invalid(message: str, param: str | None = None, code: str = "invalid_request") -> ApiError:
    return ApiError(400, message, code, param)


def input_items(value: Any) -> list[dict[str, Any]]:
    """A request's ``input`` as a list of items (a string is one user message)."""
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    if isinstance(value, list) and all(isinstance(item, dict) for item in value):
        # OpenAI takes a message without its type ({"role", "content"}); llama.cpp (b11434) answers
        # 400 "Cannot determine type of 'item'" to an assistant one: each is sent typed
        return [
            {"type": "message", **item} if "type" not in item and "role" in item else item for item in value
        ]
    raise _invalid(
        "'input' must be a string or a list of input items (messages, function calls, their outputs).",
        "input",
    )


class ResponsesCall:
    """One ``/v1/responses`` request of one key, ready for either kind of engine.

    Made by :meth:`made`, which reads the earlier conversation a ``previous_response_id`` names."""

    def __init__(
        self,
        data: dict[str, Any],
        key_id: str,
        book: ResponseBook,
        history: Sequence[dict[str, Any]] = (),
    ) -> None:
        self.data = data
        self.key_id = key_id
        self.book = book
        self.model: str = data["model"]
        self.stream = data.get("stream") is True
        self.keep = data.get("store") is not False
        self.conversation = [*history, *input_items(data.get("input"))]
        """What the engine is asked to continue: the earlier conversation, then this input."""

    @classmethod
    async def made(cls, data: dict[str, Any], key_id: str, book: ResponseBook) -> ResponsesCall:
        """The call for ``data``, continuing the response its ``previous_response_id`` names (400
        when ``key_id`` kept none of that id)."""
        history: list[dict[str, Any]] = []
        previous = data.get("previous_response_id")
        if previous is not None:
            if not isinstance(previous, str) or not previous:
                raise _invalid("'previous_response_id' must be a response's id.", "previous_response_id")
            kept = await book.get(previous, key_id)
            if kept is None:
                raise ApiError(
                    400,
                    f"Previous response with id '{previous}' not found: responses are kept "
                    f"{book.ttl_s / 3600:g} h for the key that made them, and not at all when sent with "
                    "store: false. Send the conversation in 'input' instead.",
                    "previous_response_not_found",
                    "previous_response_id",
                )
            history = kept.conversation()
        return cls(data, key_id, book, history)

    def native_body(self) -> bytes:
        """The request for an engine serving the Responses API: whole conversation, nothing kept there."""
        body = {k: v for k, v in self.data.items() if k != "previous_response_id"}
        body["input"] = self.conversation
        body["store"] = False
        return json.dumps(body, separators=(",", ":")).encode()

    def chat_body(self) -> bytes:
        """The chat completion carrying this request, for an engine without the Responses API."""
        data = self.data
        for field in UNTRANSLATED:
            if data.get(field) not in (None, False):
                raise _invalid(
                    f"'{field}' is not served for this model: its engine answers chat completions, which "
                    "llmgw translates, and a chat completion cannot carry it.",
                    field,
                    "unsupported_parameter",
                )
        chat: dict[str, Any] = {"model": self.model, "messages": chat_messages(data, self.conversation)}
        for field in CHAT_FIELDS:
            if field in data and data[field] is not None:
                chat[field] = data[field]
        if data.get("max_output_tokens") is not None:
            chat["max_tokens"] = data["max_output_tokens"]
        if data.get("top_logprobs"):
            chat["logprobs"] = True
            chat["top_logprobs"] = data["top_logprobs"]
        tools = data.get("tools")
        if tools:
            chat["tools"] = [chat_tool(tool) for tool in tools]
        if data.get("tool_choice") is not None:
            chat["tool_choice"] = chat_tool_choice(data["tool_choice"])
        text_format = (data.get("text") or {}).get("format") if isinstance(data.get("text"), dict) else None
        if isinstance(text_format, dict) and text_format.get("type") not in (None, "text"):
            chat["response_format"] = chat_response_format(text_format)
        if self.stream:
            chat["stream"] = True
            chat["stream_options"] = {"include_usage": True}
        return json.dumps(chat, separators=(",", ":")).encode()

    async def remember(self, response: dict[str, Any]) -> None:
        """Keep an answered response for follow-ups (unless sent with ``store: false``).

        A book that cannot keep it now (its store unreachable) is logged, not the client's failure:
        the answer still goes out, and a follow-up naming it answers ``previous_response_not_found``."""
        response_id = response.get("id")
        if not self.keep or not isinstance(response_id, str) or not response_id:
            return
        output = response.get("output")
        items = output if isinstance(output, list) else []
        try:
            await self.book.keep(response_id, self.key_id, self.conversation, items, response)
        except LlmgwError as error:
            log.warning("response %s was not kept for follow-ups: %s", response_id, error)

    def as_answered(self, response: dict[str, Any]) -> dict[str, Any]:
        """A native engine's response as the client is answered it: ``model`` the catalog's name,
        ``previous_response_id`` and ``store`` as the client sent them."""
        response["model"] = self.model
        response["previous_response_id"] = self.data.get("previous_response_id")
        response["store"] = self.keep
        return response

    # Answers from a native engine ------------------------------------------------------------

    async def native_whole(self, body: bytes) -> bytes:
        """A native engine's whole answer, kept for follow-ups, ``model`` the catalog's name."""
        try:
            answer = json.loads(body)
        except ValueError:
            return body
        if not isinstance(answer, dict):
            return body
        answer = self.as_answered(answer)
        await self.remember(answer)
        return json.dumps(answer, separators=(",", ":")).encode()

    def native_events(self) -> NativeEventWatcher:
        """Watches a native engine's event stream for the completed response, to keep it."""
        return NativeEventWatcher(lambda response: self.remember(self.as_answered(response)))

    # Answers translated from chat completions ---------------------------------------------------

    async def translated_whole(self, body: bytes) -> bytes:
        """A chat completion made into a Response, kept for follow-ups."""
        try:
            completion = json.loads(body)
        except ValueError as error:
            raise ApiError(502, f"The replica answered with a body that is not JSON ({error}).") from None
        response = response_object(self.data, new_id("resp"), int(time.time()))
        message_item, calls, status = items_of_completion(completion)
        response["output"] = [*([message_item] if message_item else []), *calls]
        response["status"] = status
        if status == "incomplete":
            response["incomplete_details"] = {"reason": "max_output_tokens"}
        response["usage"] = responses_usage(completion.get("usage"))
        await self.remember(response)
        return json.dumps(response, separators=(",", ":")).encode()

    def translated_events(self) -> ChatToResponseEvents:
        """Makes a chat completion's stream into the Responses API's events."""
        return ChatToResponseEvents(self.data, new_id("resp"), int(time.time()), self.remember)


def _text_of(content: Any) -> Any:
    """A message item's content as chat takes it: a string, or parts (text and images)."""
    if isinstance(content, str) or content is None:
        return content or ""
    if not isinstance(content, list):
        raise _invalid("A message's 'content' must be a string or a list of content parts.", "input")
    parts: list[dict[str, Any]] = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text", "refusal"):
            parts.append({"type": "text", "text": part.get("text", part.get("refusal", ""))})
        elif kind == "input_image":
            url = part.get("image_url") or part.get("file_id")
            parts.append({"type": "image_url", "image_url": {"url": url}})
        else:
            raise _invalid(
                f"Content part type {kind!r} is not served; send input_text or input_image.", "input"
            )
    if all(part["type"] == "text" for part in parts):
        return "".join(part["text"] for part in parts)
    return parts


def chat_messages(data: dict[str, Any], items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``instructions`` and the conversation's items as chat messages."""
    messages: list[dict[str, Any]] = []
    instructions = data.get("instructions")
    if isinstance(instructions, str) and instructions:
        messages.append({"role": "system", "content": instructions})
    for item in items:
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role", "user")
            if role not in ("user", "assistant", "system", "developer"):
                raise _invalid(
                    f"A message's role must be user, assistant, system or developer, not {role!r}."
                )
            messages.append(
                {"role": "system" if role == "developer" else role, "content": _text_of(item.get("content"))}
            )
        elif kind == "function_call":
            call = {
                "id": item.get("call_id", ""),
                "type": "function",
                "function": {"name": item.get("name", ""), "arguments": item.get("arguments", "")},
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                last["tool_calls"].append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output", "")
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": item.get("call_id", ""),
                    "content": output if isinstance(output, str) else json.dumps(output),
                }
            )
        elif kind == "reasoning":
            continue  # reasoning is the model's own; it is not sent back
        else:
            raise _invalid(
                f"Input item type {kind!r} is not served; send messages, function_call and "
                "function_call_output items.",
                "input",
            )
    return messages


def chat_tool(tool: Any) -> dict[str, Any]:
    """A Responses function tool as a chat tool; any other kind of tool is refused."""
    if not isinstance(tool, dict) or tool.get("type") != "function":
        kind = tool.get("type") if isinstance(tool, dict) else tool
        raise _invalid(
            f"Tool type {kind!r} is not served: llmgw serves function tools (type 'function').",
            "tools",
            "unsupported_tool",
        )
    function = {k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}
    return {"type": "function", "function": function}


def chat_tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name", "")}}
    return choice


def chat_response_format(text_format: dict[str, Any]) -> dict[str, Any]:
    kind = text_format.get("type")
    if kind == "json_schema":
        schema = {k: text_format[k] for k in ("name", "schema", "strict", "description") if k in text_format}
        return {"type": "json_schema", "json_schema": schema}
    if kind == "json_object":
        return {"type": "json_object"}
    raise _invalid(f"text.format type {kind!r} is not served; use text, json_object or json_schema.", "text")


def items_of_completion(completion: Any) -> tuple[dict[str, Any] | None, list[dict[str, Any]], str]:
    """(the message item, the function call items, the status) of a whole chat completion."""
    choices = completion.get("choices") if isinstance(completion, dict) else None
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    message = choice.get("message") or {}
    text = message.get("content")
    item = None
    if text:
        item = {
            "type": "message",
            "id": new_id("msg"),
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
        }
    calls = [
        {
            "type": "function_call",
            "id": new_id("fc"),
            "call_id": call.get("id", ""),
            "name": (call.get("function") or {}).get("name", ""),
            "arguments": (call.get("function") or {}).get("arguments", ""),
            "status": "completed",
        }
        for call in message.get("tool_calls") or ()
        if isinstance(call, dict)
    ]
    status = "incomplete" if choice.get("finish_reason") == "length" else "completed"
    return item, calls, status
