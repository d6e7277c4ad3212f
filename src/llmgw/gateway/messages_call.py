"""A Messages request on its way to a chat engine: the chat body sent, and how the answer comes back.

:class:`MessagesCall` is the forwarding path's answer shape (shaping.py) for
``/v1/messages``: a whole chat completion is made into Anthropic's
``message`` (messages_api.py), a stream into Messages events
(messages_events.py).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from llmgw.gateway.api_errors import ApiError
from llmgw.gateway.messages_api import chat_body, invalid, message_id, message_object
from llmgw.gateway.messages_events import ChatToMessageEvents
from llmgw.gateway.messages_native import NativeMessages


class MessagesCall:
    """A Messages request as the chat completion sent for it, and how its answer is reshaped back.

    It is the forwarding path's answer shape (shaping.py): a whole chat answer is
    made into a ``message``, a stream into Messages events."""

    def __init__(self, data: dict[str, Any], raw: bytes = b"") -> None:
        self.raw = raw
        """The request as the client sent it: what goes to an engine serving the Messages API itself."""
        self.chat = chat_body(data)
        self.model: str = self.chat["model"]
        self.stream = bool(self.chat.get("stream"))
        self.stops: Sequence[str] = self.chat.get("stop") or ()
        self.body = json.dumps(self.chat, separators=(",", ":")).encode()

    async def whole(self, body: bytes) -> bytes:
        try:
            completion = json.loads(body)
        except ValueError as error:
            raise ApiError(502, "The engine's answer was not JSON; ask again.", "api_error") from error
        message = message_object(completion if isinstance(completion, dict) else {}, self.model, self.stops)
        return json.dumps(message, separators=(",", ":")).encode()

    def native(self) -> NativeMessages | None:
        """The shape of its answer from an engine serving the Messages API itself (None: the request
        must go as a chat completion)."""
        return NativeMessages(self.model) if self.raw else None

    def events(self) -> ChatToMessageEvents:
        return ChatToMessageEvents(message_id(), self.model, self.stops)


def translated(body: bytes, counting: bool = False) -> MessagesCall:
    """The Messages request in ``body``, translated (400 when it is not a JSON object); one only
    counted (``count_tokens``) needs no ``max_tokens``."""
    try:
        data = json.loads(body)
    except ValueError as error:
        raise invalid("body", "is not JSON: send a Messages request as a JSON object.") from error
    if not isinstance(data, dict):
        raise invalid("body", "must be a JSON object.")
    if counting:
        return MessagesCall({**data, "max_tokens": 1, "stream": False})
    return MessagesCall(data, body)
