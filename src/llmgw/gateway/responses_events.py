"""The Responses API's streamed events: made from a chat completion's stream, or watched going by.

:class:`ChatToResponseEvents` takes a chat completion's SSE events (whole
events, as :class:`~llmgw.gateway.usage.EventFramer` passes them) and gives
the Responses API's events in the order OpenAI sends them::

    response.created, response.in_progress
    per message:   response.output_item.added, response.content_part.added,
                   response.output_text.delta ..., response.output_text.done,
                   response.content_part.done, response.output_item.done
    per tool call: response.output_item.added, response.function_call_arguments.delta ...,
                   response.function_call_arguments.done, response.output_item.done
    response.completed (or response.incomplete), with the output and usage

each as ``event: <type>`` and ``data: {... "sequence_number": n}``. The chat
stream's ``[DONE]`` is not passed on (a Responses stream ends with its last
event). :class:`NativeEventWatcher` passes an engine's own Responses events on
unchanged and keeps the completed response for follow-ups.

Both keep the response before they give the bytes holding ``response.completed``
(or ``response.incomplete``): :meth:`feed` and :meth:`finish` are awaited, and
the keep with them, so a client that has seen the response completed finds it
kept for its follow-up.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

from llmgw.gateway.chat_events import chat_chunks, data_lines

Remember = Callable[[dict[str, Any]], Awaitable[None]]
"""Keeps a response (its id, output items and the whole object) for follow-ups."""

ECHOED = (
    "instructions", "max_output_tokens", "metadata", "parallel_tool_calls", "previous_response_id",
    "temperature", "tool_choice", "tools", "top_p", "top_logprobs", "truncation", "user",
)  # fmt: skip
"""Request fields a Response repeats."""


def response_object(data: dict[str, Any], response_id: str, created: int) -> dict[str, Any]:
    """A Response for the request ``data``, in progress, with no output yet."""
    response: dict[str, Any] = {
        "id": response_id,
        "object": "response",
        "created_at": created,
        "status": "in_progress",
        "model": data.get("model"),
        "output": [],
        "error": None,
        "incomplete_details": None,
        "usage": None,
        "store": data.get("store") is not False,
        "text": data.get("text") or {"format": {"type": "text"}},
    }
    for field in ECHOED:
        response[field] = data.get(field)
    response["tools"] = data.get("tools") or []
    response["tool_choice"] = data.get("tool_choice") or "auto"
    response["parallel_tool_calls"] = data.get("parallel_tool_calls") is not False
    response["metadata"] = data.get("metadata") or {}
    return response


def _event(kind: str, sequence: int, fields: dict[str, Any]) -> bytes:
    data = {"type": kind, "sequence_number": sequence, **fields}
    return (
        b"event: " + kind.encode() + b"\ndata: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"
    )


class _Sequenced:
    """Numbers the events it makes."""

    def __init__(self) -> None:
        self.sequence = 0

    def event(self, kind: str, **fields: Any) -> bytes:
        made = _event(kind, self.sequence, fields)
        self.sequence += 1
        return made

    def error(self, message: str, code: str) -> bytes:
        """The Responses API's ``error`` event, for a stream the gateway must end."""
        return self.event("error", code=code, message=message, param=None)


class ChatToResponseEvents(_Sequenced):
    """A chat completion's stream, as the Responses API's events."""

    def __init__(self, data: dict[str, Any], response_id: str, created: int, remember: Remember) -> None:
        super().__init__()
        self.response = response_object(data, response_id, created)
        self._remember = remember
        self._started = False
        self._text: list[str] = []
        self._message: dict[str, Any] | None = None
        self._calls: dict[int, dict[str, Any]] = {}
        """Function call items by the chat stream's tool call index."""
        self._output_index = 0
        self._finish_reason: str | None = None
        self._usage: dict[str, Any] | None = None
        self._done = False

    def _start(self) -> bytes:
        if self._started:
            return b""
        self._started = True
        return self.event("response.created", response=self.response) + self.event(
            "response.in_progress", response=self.response
        )

    async def feed(self, events: bytes) -> bytes:
        """The Responses events for a run of whole chat events."""
        out = [self._start()]
        for chunk in chat_chunks(events):
            if chunk is None:
                out.append(await self.finish())
                continue
            if isinstance(chunk.get("usage"), dict):
                self._usage = chunk["usage"]
            for choice in chunk.get("choices") or ():
                if isinstance(choice, dict):
                    out.append(self._choice(choice))
        return b"".join(out)

    def _choice(self, choice: dict[str, Any]) -> bytes:
        out = []
        delta = choice.get("delta") or {}
        text = delta.get("content")
        if text:
            out.append(self._open_message())
            self._text.append(text)
            assert self._message is not None
            out.append(
                self.event(
                    "response.output_text.delta",
                    item_id=self._message["id"],
                    output_index=self._message["_index"],
                    content_index=0,
                    delta=text,
                    logprobs=[],
                )
            )
        for call in delta.get("tool_calls") or ():
            if isinstance(call, dict):
                out.append(self._tool_delta(call))
        if choice.get("finish_reason"):
            self._finish_reason = choice["finish_reason"]
        return b"".join(out)

    def _open_message(self) -> bytes:
        if self._message is not None:
            return b""
        item_id = "msg_" + secrets.token_hex(16)
        self._message = {"id": item_id, "_index": self._output_index}
        self._output_index += 1
        item = {"type": "message", "id": item_id, "status": "in_progress", "role": "assistant", "content": []}
        part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        return self.event("response.output_item.added", output_index=self._message["_index"], item=item) + (
            self.event(
                "response.content_part.added",
                item_id=item_id,
                output_index=self._message["_index"],
                content_index=0,
                part=part,
            )
        )

    def _tool_delta(self, call: dict[str, Any]) -> bytes:
        index = call.get("index", len(self._calls))
        function = call.get("function") or {}
        item = self._calls.get(index)
        out = []
        if item is None:
            item = {
                "type": "function_call",
                "id": "fc_" + secrets.token_hex(16),
                "call_id": call.get("id") or "call_" + secrets.token_hex(12),
                "name": function.get("name") or "",
                "arguments": "",
                "status": "in_progress",
                "_index": self._output_index,
            }
            self._output_index += 1
            self._calls[index] = item
            shown = {k: v for k, v in item.items() if not k.startswith("_")}
            out.append(self.event("response.output_item.added", output_index=item["_index"], item=shown))
        arguments = function.get("arguments")
        if arguments:
            item["arguments"] += arguments
            out.append(
                self.event(
                    "response.function_call_arguments.delta",
                    item_id=item["id"],
                    output_index=item["_index"],
                    delta=arguments,
                )
            )
        return b"".join(out)

    async def finish(self) -> bytes:
        """The closing events: every open item done, then the completed response (once, kept first)."""
        if self._done:
            return b""
        self._done = True
        out = [self._start()]
        items: list[tuple[int, dict[str, Any]]] = []
        if self._message is not None:
            text = "".join(self._text)
            item_id, index = self._message["id"], self._message["_index"]
            part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
            item = {
                "type": "message",
                "id": item_id,
                "status": "completed",
                "role": "assistant",
                "content": [part],
            }
            out.append(
                self.event(
                    "response.output_text.done",
                    item_id=item_id,
                    output_index=index,
                    content_index=0,
                    text=text,
                    logprobs=[],
                )
            )
            out.append(
                self.event(
                    "response.content_part.done",
                    item_id=item_id,
                    output_index=index,
                    content_index=0,
                    part=part,
                )
            )
            out.append(self.event("response.output_item.done", output_index=index, item=item))
            items.append((index, item))
        for call in self._calls.values():
            done = {k: v for k, v in call.items() if not k.startswith("_")}
            done["status"] = "completed"
            out.append(
                self.event(
                    "response.function_call_arguments.done",
                    item_id=call["id"],
                    output_index=call["_index"],
                    arguments=call["arguments"],
                )
            )
            out.append(self.event("response.output_item.done", output_index=call["_index"], item=done))
            items.append((call["_index"], done))
        response = self.response
        response["output"] = [item for _, item in sorted(items, key=lambda pair: pair[0])]
        response["usage"] = responses_usage(self._usage)
        if self._finish_reason == "length":
            response["status"] = "incomplete"
            response["incomplete_details"] = {"reason": "max_output_tokens"}
            out.append(self.event("response.incomplete", response=response))
        else:
            response["status"] = "completed"
            out.append(self.event("response.completed", response=response))
        await self._remember(response)
        return b"".join(out)


class NativeEventWatcher(_Sequenced):
    """Passes an engine's own Responses events on, keeping the completed response for follow-ups."""

    def __init__(self, remember: Remember) -> None:
        super().__init__()
        self._remember = remember

    async def feed(self, events: bytes) -> bytes:
        if b"response.completed" in events or b"response.incomplete" in events:
            for payload in data_lines(events):
                try:
                    event = json.loads(payload)
                except ValueError:
                    continue
                if isinstance(event, dict) and event.get("type") in (
                    "response.completed",
                    "response.incomplete",
                ):
                    response = event.get("response")
                    if isinstance(response, dict):
                        await self._remember(response)
        self.sequence += events.count(b"data:")  # an error event the gateway adds comes next
        return events

    async def finish(self) -> bytes:
        return b""


def responses_usage(usage: Any) -> dict[str, Any] | None:
    """A chat ``usage`` object in the Responses API's shape."""
    if not isinstance(usage, dict):
        return None
    prompt = usage.get("prompt_tokens") or 0
    completion = usage.get("completion_tokens") or 0
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    reasoning = (usage.get("completion_tokens_details") or {}).get("reasoning_tokens") or 0
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": usage.get("total_tokens") or prompt + completion,
    }
