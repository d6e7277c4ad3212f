"""A response's head held until its body's first write (or the loop's next turn): one send per answer."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

from llmgw.controlplane.config import HttpSettings
from llmgw.controlplane.serving.headholding import HeadHolding
from llmgw.controlplane.serving.httpserving import HttpServer


class _Recording(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.sends: list[bytes] = []
        self.closed = self.aborted = False

    def write(self, data: Any) -> None:
        self.sends.append(bytes(data))

    def writelines(self, list_of_data: Any) -> None:
        self.sends.append(b"".join(list_of_data))  # one writev

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def is_closing(self) -> bool:
        return self.closed or self.aborted

    def get_write_buffer_size(self) -> int:
        return 0


async def test_the_head_and_the_body_written_in_one_step_leave_in_one_send() -> None:
    inner = _Recording()
    held = HeadHolding(inner, asyncio.get_running_loop())
    held.write(b"HEAD")
    assert inner.sends == [] and held.get_write_buffer_size() == 4
    held.write(b"BODY")
    held.write(b"MORE")
    assert inner.sends == [b"HEADBODY", b"MORE"]  # only the first write is held
    await asyncio.sleep(0)
    assert inner.sends == [b"HEADBODY", b"MORE"]  # nothing sent twice


async def test_a_head_whose_body_is_not_ready_is_sent_at_the_loops_next_turn() -> None:
    inner = _Recording()
    held = HeadHolding(inner, asyncio.get_running_loop())
    held.write(b"HEAD")
    await asyncio.sleep(0)
    assert inner.sends == [b"HEAD"]
    held.write(b"EVENT")
    assert inner.sends == [b"HEAD", b"EVENT"]


async def test_close_sends_what_is_held_first_and_abort_drops_it() -> None:
    loop = asyncio.get_running_loop()
    inner = _Recording()
    held = HeadHolding(inner, loop)
    held.write(b"HEAD")
    held.close()
    assert inner.sends == [b"HEAD"] and inner.closed
    await asyncio.sleep(0)
    assert inner.sends == [b"HEAD"]
    dropped = _Recording()
    aborted = HeadHolding(dropped, loop)
    aborted.write(b"HEAD")
    aborted.abort()
    await asyncio.sleep(0)
    assert dropped.sends == [] and dropped.aborted


def _read_answer(sock: socket.socket, until: bytes) -> bytes:
    data = b""
    while until not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


async def test_a_server_answers_whole_and_streamed_responses_through_it() -> None:
    requests = 3
    release = asyncio.Event()

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await receive()
        if scope["path"] == "/stream":
            await send({"type": "http.response.start", "status": 200, "headers": [(b"x-kind", b"stream")]})
            await release.wait()  # the head must reach the client before any body exists
            await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": False})
            return
        body = scope["path"].encode()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(body)).encode())]})  # fmt: skip
        await send({"type": "http.response.body", "body": body})

    server = HttpServer(app, HttpSettings(host="127.0.0.1", port=0))
    serving = asyncio.create_task(server.serve_until_stopped())
    await asyncio.wait_for(server.listening.wait(), 10)
    loop = asyncio.get_running_loop()
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
            for n in range(requests):  # kept alive: each answer whole, in order
                sock.sendall(f"GET /r{n} HTTP/1.1\r\nhost: x\r\n\r\n".encode())
                answer = await loop.run_in_executor(None, _read_answer, sock, f"/r{n}".encode())
                assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(f"\r\n\r\n/r{n}".encode())
            connections = list(server.server_state.connections)
            assert [type(c.cycle.transport) for c in connections] == [HeadHolding]  # type: ignore[attr-defined]
            sock.sendall(b"GET /stream HTTP/1.1\r\nhost: x\r\n\r\n")
            head = await loop.run_in_executor(None, _read_answer, sock, b"\r\n\r\n")
            assert b"x-kind: stream" in head and b"data:" not in head
            release.set()
            rest = await loop.run_in_executor(None, _read_answer, sock, b"0\r\n\r\n")
            assert b"data: 1" in head + rest
    finally:
        await server.stop()
        await serving
