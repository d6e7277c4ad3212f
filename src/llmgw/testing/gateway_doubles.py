"""The gateway's two outward parts in memory: the replicas it calls and the control plane it tells.

::

    upstream = MemoryUpstream(GatewaySettings())
    engine = upstream.engine(MemoryEngine("r1"))             # answers at its endpoint's address
    outbound = RecordingOutbound()
    gateway = Gateway(settings, upstream=upstream, outbound=outbound)
    gateway.feed.replica_ready(engine.endpoint)
    ...
    await eventually(lambda: outbound.records)                 # what the gateway told

:class:`MemoryUpstream` is an :class:`~llmgw.gateway.upstream.UpstreamClient`
with no sockets: each request goes to the :class:`MemoryEngine` registered at
its endpoint's ``base_url`` (none there: :class:`~llmgw.gateway.upstream.Unreachable`,
as a closed port is), which answers as an OpenAI-compatible engine does —
whole or streamed, chat, completions, embeddings, rerank, Responses — and
can be told to fail the ways a real one does: an error status, dropping the
connection on arrival, mid-stream or mid-body, holding its answer (a slow
engine; past ``upstream_timeout_s`` the gateway sees
:class:`~llmgw.gateway.upstream.UpstreamTimeout`; past a request's ``deadline``
:class:`~llmgw.gateway.upstream.RequestTimedOut`, and the engine's handler is
cancelled as a closed connection cancels it). What reached it is kept
(:attr:`MemoryEngine.requests`). The HTTP client itself
(:class:`~llmgw.gateway.upstream.Upstream`) is tested over real sockets.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from multidict import CIMultiDict

from llmgw.gateway.replicas import ReplicaEndpoint
from llmgw.gateway.settings import GatewaySettings
from llmgw.gateway.upstream import RequestTimedOut, Unreachable, UpstreamDropped, UpstreamTimeout
from llmgw.gateway.usage import UsageRecord

MODEL = "tiny-chat"
"""The model a :class:`MemoryEngine` serves unless told another."""


@dataclass
class RecordingOutbound:
    """A :class:`~llmgw.gateway.outbound.GatewayOutbound` that keeps what it was told, in order."""

    wanted: list[str] = field(default_factory=list)
    """Models a request wanted a replica of (:meth:`replica_wanted`)."""
    used: list[str] = field(default_factory=list)
    """Catalog models requests kept in use (:meth:`model_used`)."""
    records: list[UsageRecord] = field(default_factory=list)
    """Usage of ended requests (:meth:`usage`)."""
    failed: list[tuple[str, str]] = field(default_factory=list)
    """Replicas that could not be reached, with the reason (:meth:`replica_failed`)."""

    def replica_wanted(self, model: str) -> None:
        self.wanted.append(model)

    def model_used(self, model: str) -> None:
        self.used.append(model)

    def usage(self, record: UsageRecord) -> None:
        self.records.append(record)

    def replica_failed(self, replica_id: str, reason: str) -> None:
        self.failed.append((replica_id, reason))


@dataclass
class Received:
    """One request as it reached a :class:`MemoryEngine`."""

    path: str
    headers: CIMultiDict[str]
    body: bytes


class MemoryAnswer:
    """An :class:`~llmgw.gateway.upstream.UpstreamAnswer` written by a :class:`MemoryEngine`."""

    def __init__(self, timeout_s: float) -> None:
        self.status = 0
        self.content_type = ""
        self._timeout_s = timeout_s
        self._chunks: deque[bytes] = deque()
        self._done = False
        self._error: BaseException | None = None
        self._more = asyncio.Event()
        self.headers: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.task: asyncio.Task[None] | None = None
        self.deadline: asyncio.TimerHandle | None = None
        self.path = ""
        """The engine path it answers (/v1/chat/completions, /tokenize, …)."""
        self.reading = False
        """True while the request waits for more of the body (it got the head and reads on)."""
        self.released = False
        self.closed = False

    # -- the engine's side ---------------------------------------------------------------------------

    def start(self, status: int, content_type: str = "application/json") -> None:
        self.status, self.content_type = status, content_type
        if not self.headers.done():
            self.headers.set_result(None)

    def write(self, data: bytes) -> None:
        self._chunks.append(data)
        self._more.set()

    def end(self) -> None:
        self._done = True
        self._more.set()

    def drop(self, reason: str = "connection reset") -> None:
        """The connection broke: before the headers the request saw no answer at all."""
        error = UpstreamDropped(f"the replica closed the connection ({reason})")
        if not self.headers.done():
            self.headers.set_exception(error)
        elif not self._done:
            self._error = error
            self._more.set()

    def expire(self) -> None:
        """The request's deadline passed: its waits fail and the engine's handler is cancelled."""
        self.deadline = None
        if self._done:
            return
        error = RequestTimedOut("the request's time limit ran out")
        if not self.headers.done():
            self.headers.set_exception(error)
        else:
            self._error = error
            self._more.set()
        self.close()

    # -- the request's side --------------------------------------------------------------------------

    async def _next(self) -> bytes:
        while not self._chunks:
            if self._done:
                return b""
            if self._error is not None:
                raise self._error
            self._more.clear()
            self.reading = True
            try:
                async with asyncio.timeout(self._timeout_s):
                    await self._more.wait()
            except TimeoutError:
                raise UpstreamTimeout("the replica stopped answering") from None
            finally:
                self.reading = False
        data = b"".join(self._chunks)
        self._chunks.clear()
        return data

    async def read(self) -> bytes:
        parts = []
        while chunk := await self._next():
            parts.append(chunk)
        return b"".join(parts)

    async def iter_any(self) -> AsyncIterator[bytes]:
        while chunk := await self._next():
            yield chunk

    def release(self) -> None:
        self.released = True
        if not self._done:
            self.close()
        elif self.deadline is not None:
            self.deadline.cancel()

    def close(self) -> None:
        """The gateway dropped the connection: the engine's handler is cancelled (it sees the client gone)."""
        self.closed = True
        if self.deadline is not None:
            self.deadline.cancel()
        if self.task is not None and not self.task.done():
            self.task.cancel()


def engine_answer(path: str, data: dict[str, Any], replica_id: str, answered: int) -> dict[str, Any]:
    """An engine's whole answer to ``data`` on ``path`` (chat, completions, embeddings, rerank, responses):
    its text is ``replica_id``; a response's id counts the requests ``answered`` before it."""
    usage = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
    if path.endswith("/rerank"):
        ranked = [{"index": i, "relevance_score": 1.0 / (i + 1)} for i in range(len(data["documents"]))]
        return {
            "model": data["model"],
            "results": ranked,
            "usage": {"prompt_tokens": 6, "total_tokens": 6},
        }
    if path.endswith(
        "/v1/messages"
    ):  # as llama-server b11434 answers (tests/engines/data/llamacpp-b11434-messages-*)
        return {
            "id": "chatcmpl-1",
            "type": "message",
            "role": "assistant",
            "content": [{"type": "text", "text": replica_id}],
            "model": "/weights/model.gguf",
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {"cache_read_input_tokens": 0, "input_tokens": 7, "output_tokens": 3},
        }
    if path.endswith("/responses"):
        text = {"type": "output_text", "text": replica_id, "annotations": []}
        item = {
            "type": "message",
            "id": "msg_1",
            "status": "completed",
            "role": "assistant",
            "content": [text],
        }
        return {
            "id": f"resp_{answered}",
            "object": "response",
            "created_at": 1700000000,
            "status": "completed",
            "model": "/weights/model.gguf",
            "output": [item],
            "usage": {"input_tokens": 9, "output_tokens": 2, "total_tokens": 11},
        }
    if path.endswith("/embeddings"):
        return {
            "object": "list",
            "model": data["model"],
            "data": [{"object": "embedding", "index": 0, "embedding": [0.5, -0.25]}],
            "usage": {"prompt_tokens": 4, "total_tokens": 4},
        }
    if path.endswith("/v1/completions"):
        choice: dict[str, Any] = {
            "index": 0,
            "text": replica_id,
            "finish_reason": "stop",
            "logprobs": None,
        }
        kind = "text_completion"
    else:
        message = {"role": "assistant", "content": replica_id}
        choice = {"index": 0, "message": message, "finish_reason": "stop"}
        kind = "chat.completion"
    return {
        "id": "cmpl-1",
        "object": kind,
        "created": 1700000000,
        "model": data["model"],
        "choices": [choice],
        "usage": usage,
    }


@dataclass
class MemoryEngine:
    """An OpenAI-compatible engine in memory that records what reaches it (one replica's)."""

    replica_id: str = "r1"
    key: str = "replica-key-r1"
    model: str = MODEL
    chunks: int = 3
    """Content chunks in a streamed answer (then a usage chunk when the request asks for it, and [DONE])."""
    hold: asyncio.Event | None = None
    """When set, every answer waits for this event before it starts (a slow engine)."""
    hold_after_first: asyncio.Event | None = None
    """When set, a stream waits for this event after its first chunk."""
    cut_after: int | None = None
    """When set, a stream's connection is dropped after this many chunks."""
    cut_whole: bool = False
    """When set, a whole (non-streamed) answer's connection is dropped halfway through its body."""
    abort_on_arrival: bool = False
    """When set, the connection of every request is dropped as soon as the request arrived."""
    error: tuple[int, bytes] | None = None
    """When set, every request is answered with this status and body."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Routes of its own: path -> the JSON answered (200), e.g. ``/tokenize``."""
    requests: list[Received] = field(default_factory=list)
    arrived: asyncio.Event = field(default_factory=asyncio.Event)
    dropped: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the gateway dropped a request before its answer ended."""
    base_url: str = ""
    """Where it answers (set by :meth:`MemoryUpstream.engine`)."""

    @property
    def endpoint(self) -> ReplicaEndpoint:
        return ReplicaEndpoint(self.replica_id, self.model, self.base_url, self.key, capacity=4)

    def endpoint_for(self, model: str = MODEL, engine: str = "llama.cpp") -> ReplicaEndpoint:
        """This engine as a replica of ``model`` run by ``engine``."""
        replica_id = self.replica_id if model == self.model else f"{self.replica_id}-{model}"
        return ReplicaEndpoint(replica_id, model, self.base_url, self.key, capacity=4, engine=engine)

    async def stop(self) -> None:
        for event in (self.hold, self.hold_after_first):
            if event is not None:
                event.set()

    async def serve(self, received: Received, answer: MemoryAnswer) -> None:
        """Answer one request into ``answer`` (run as a task of its own, cancelled when dropped)."""
        self.requests.append(received)
        self.arrived.set()
        try:
            await self._serve(received, answer)
        except asyncio.CancelledError:
            self.dropped.set()
            raise

    async def _serve(self, received: Received, answer: MemoryAnswer) -> None:
        if self.abort_on_arrival:
            answer.drop()
            return
        if received.headers.get("Authorization") != f"Bearer {self.key}":
            error = {"error": {"code": 401, "message": "Invalid API Key", "type": "authentication_error"}}
            answer.start(401)
            answer.write(json.dumps(error).encode())
            answer.end()
            return
        data = json.loads(received.body)
        if self.hold is not None:
            await self.hold.wait()
        if self.error is not None:
            status, raw = self.error
            answer.start(status)
            answer.write(raw)
            answer.end()
            return
        if received.path in self.extra:
            answer.start(200)
            answer.write(json.dumps(self.extra[received.path]).encode())
            answer.end()
            return
        if data.get("stream"):
            if received.path.endswith("/responses"):
                await self._response_events(answer, data)
            elif received.path.endswith("/v1/messages"):
                await self._message_events(answer)
            else:
                await self._stream(answer, data)
            return
        body = json.dumps(self.answer(received.path, data)).encode()
        answer.start(200)
        if self.cut_whole:
            answer.write(body[: len(body) // 2])
            answer.drop()
            return
        answer.write(body)
        answer.end()

    def answer(self, path: str, data: dict[str, Any]) -> dict[str, Any]:
        """The whole answer to ``data`` on ``path``."""
        return engine_answer(path, data, self.replica_id, len(self.requests))

    async def _stream(self, answer: MemoryAnswer, data: dict[str, Any]) -> None:
        answer.start(200, "text/event-stream")

        def event(payload: dict[str, Any]) -> bytes:
            base = {
                "id": "chunk-1",
                "object": "chat.completion.chunk",
                "created": 1700000000,
                "model": data["model"],
            }
            return b"data: " + json.dumps(base | payload).encode() + b"\n\n"

        for i in range(self.chunks):
            delta = {"index": 0, "delta": {"content": f"{self.replica_id}-{i} "}, "finish_reason": None}
            answer.write(event({"choices": [delta]}))
            await asyncio.sleep(0)  # each chunk its own arrival, as over a socket
            if self.cut_after is not None and i + 1 == self.cut_after:
                answer.drop()
                return
            if i == 0 and self.hold_after_first is not None:
                await self.hold_after_first.wait()
        options = data.get("stream_options")
        if isinstance(options, dict) and options.get("include_usage") is True:
            usage = {"prompt_tokens": 7, "completion_tokens": self.chunks, "total_tokens": 7 + self.chunks}
            answer.write(event({"choices": [], "usage": usage}))
        answer.write(b"data: [DONE]\n\n")
        answer.end()

    async def _message_events(self, answer: MemoryAnswer) -> None:
        """A Messages stream in llama-server b11434's order and fields (its recording in
        tests/engines/data/llamacpp-b11434-messages-stream.txt)."""
        answer.start(200, "text/event-stream")

        def event(kind: str, **fields: Any) -> bytes:
            payload = json.dumps({"type": kind, **fields}, separators=(",", ":"))
            return f"event: {kind}\ndata: {payload}\n\n".encode()

        usage = {"cache_read_input_tokens": 0, "input_tokens": 7, "output_tokens": 0}
        message: dict[str, Any] = {"id": "chatcmpl-1", "type": "message", "role": "assistant", "content": [],
                   "model": "/weights/model.gguf", "stop_reason": None, "stop_sequence": None,
                   "usage": usage}  # fmt: skip
        answer.write(event("message_start", message=message))
        answer.write(event("content_block_start", index=0, content_block={"type": "text", "text": ""}))
        for i in range(self.chunks):
            delta = {"type": "text_delta", "text": f"{self.replica_id}-{i} "}
            answer.write(event("content_block_delta", index=0, delta=delta))
            await asyncio.sleep(0)
            if self.cut_after is not None and i + 1 == self.cut_after:
                answer.drop()
                return
        answer.write(event("content_block_stop", index=0))
        end = {"stop_reason": "end_turn", "stop_sequence": None}
        answer.write(event("message_delta", delta=end, usage={"output_tokens": self.chunks}))
        answer.write(event("message_stop"))
        answer.end()

    async def _response_events(self, answer: MemoryAnswer, data: dict[str, Any]) -> None:
        """A Responses stream as an engine serving the API sends it: created, the text's deltas, then
        completed with the whole response (its id as :func:`engine_answer` gives it)."""
        answer.start(200, "text/event-stream")
        whole = self.answer("/v1/responses", data)
        texts = [f"{self.replica_id}-{i} " for i in range(self.chunks)]
        whole["output"][0]["content"][0]["text"] = "".join(texts)
        started = {**whole, "status": "in_progress", "output": [], "usage": None}
        sequence = 0

        def event(kind: str, **fields: Any) -> bytes:
            nonlocal sequence
            payload = {"type": kind, "sequence_number": sequence, **fields}
            sequence += 1
            return b"event: " + kind.encode() + b"\ndata: " + json.dumps(payload).encode() + b"\n\n"

        answer.write(event("response.created", response=started))
        for i, text in enumerate(texts):
            answer.write(
                event(
                    "response.output_text.delta", item_id="msg_1", output_index=0, content_index=0, delta=text
                )
            )
            await asyncio.sleep(0)
            if self.cut_after is not None and i + 1 == self.cut_after:
                answer.drop()
                return
        answer.write(event("response.completed", response=whole))
        answer.end()


class MemoryUpstream:
    """An :class:`~llmgw.gateway.upstream.UpstreamClient` calling :class:`MemoryEngine` s, no sockets."""

    def __init__(self, settings: GatewaySettings | None = None) -> None:
        self.settings = settings or GatewaySettings()
        self._engines: dict[str, MemoryEngine] = {}
        self._count = 0
        self.answers: list[MemoryAnswer] = []
        """Every answer handed out, in order (each knows whether it was released or closed)."""

    def engine(self, engine: MemoryEngine) -> MemoryEngine:
        """Answer at ``engine``'s own address from now on (a new one when it has none)."""
        if not engine.base_url:
            self._count += 1
            engine.base_url = f"http://memory-{self._count}.invalid:8000"
        self._engines[engine.base_url] = engine
        return engine

    def remove(self, engine: MemoryEngine) -> None:
        """Nothing answers at ``engine``'s address any more (as a stopped engine's closed port)."""
        self._engines.pop(engine.base_url, None)

    async def post(
        self,
        endpoint: ReplicaEndpoint,
        path: str,
        body: bytes,
        request_id: bytes,
        traceparent: bytes = b"",
        deadline: float | None = None,
    ) -> MemoryAnswer:
        engine = self._engines.get(endpoint.base_url)
        if engine is None:
            raise Unreachable(endpoint, "connection refused (nothing answers there)", connecting=True)
        headers: CIMultiDict[str] = CIMultiDict(
            {
                "Authorization": f"Bearer {endpoint.api_key}",
                "Content-Type": "application/json",
                "x-request-id": request_id.decode("latin-1"),
            }
        )
        if traceparent:
            headers["traceparent"] = traceparent.decode("latin-1")
        timeout_s = self.settings.upstream_timeout_s
        answer = MemoryAnswer(timeout_s)
        answer.path = path
        self.answers.append(answer)
        loop = asyncio.get_running_loop()
        answer.task = loop.create_task(engine.serve(Received(path, headers, body), answer))
        if deadline is not None:
            answer.deadline = loop.call_at(deadline, answer.expire)
        try:
            async with asyncio.timeout(timeout_s):
                await answer.headers
        except TimeoutError:
            answer.close()
            raise UpstreamTimeout(
                f"replica {endpoint.replica_id} sent no answer within {timeout_s:g} s"
            ) from None
        except UpstreamDropped as error:
            answer.close()
            raise Unreachable(endpoint, str(error), connecting=False) from error
        except BaseException:
            answer.close()
            raise
        return answer

    async def close(self) -> None:
        for answer in self.answers:
            if answer.task is not None and not answer.task.done():
                answer.task.cancel()
