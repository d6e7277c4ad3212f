"""A control plane's restart keeps its HTTP listening socket: the next start serves on it, and a
client that connected in between is answered, not refused (C10.1)."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from llmgw.controlplane.lifecycle.selfrestart import (
    HTTP_FD_ENV,
    INSTANCE,
    WORKERS_ENV,
    hand_over,
    hand_over_workers,
    inherited_socket,
    inherited_workers,
)
from llmgw.controlplane.running import ControlPlane
from llmgw.controlplane.serving.relaying import relayed_paths
from llmgw.provisioning.clusters import initialise
from llmgw.testing.postgres import free_port


@pytest.fixture
def listening() -> Iterator[socket.socket]:
    sock = socket.create_server(("127.0.0.1", 0))
    os.environ.pop(HTTP_FD_ENV, None)
    try:
        yield sock
    finally:
        sock.close()
        os.environ.pop(HTTP_FD_ENV, None)


def test_the_socket_handed_over_outlives_the_server_closing_it_and_takes_the_waiting_client(
    listening: socket.socket,
) -> None:
    port = listening.getsockname()[1]
    hand_over(listening)
    listening.close()  # the old server stops
    client = socket.create_connection(("127.0.0.1", port), timeout=2)  # waits in the backlog
    taken = inherited_socket("127.0.0.1", port)
    assert taken is not None and HTTP_FD_ENV not in os.environ
    try:
        taken.setblocking(True)
        connection, _ = taken.accept()
        client.sendall(b"ping")
        assert connection.recv(4) == b"ping"
        connection.close()
    finally:
        client.close()
        taken.close()


def test_a_socket_handed_over_on_another_port_is_not_used(listening: socket.socket) -> None:
    port = listening.getsockname()[1]
    hand_over(listening)
    assert inherited_socket("127.0.0.1", port + 1 if port < 65535 else port - 1) is None
    assert HTTP_FD_ENV not in os.environ


def test_workers_handed_over_are_named_to_the_next_start_once() -> None:
    hand_over_workers(8080, [42, 7])
    assert inherited_workers() == (8080, [7, 42])
    assert inherited_workers() is None  # taken: a later start of its own binds anew
    os.environ[WORKERS_ENV] = "not-a-port:1"
    assert inherited_workers() is None


def test_nothing_handed_over_means_binding_anew() -> None:
    os.environ.pop(HTTP_FD_ENV, None)
    assert inherited_socket("127.0.0.1", 8080) is None


def test_a_control_plane_answers_its_own_restart_itself_and_relays_the_cluster_s() -> None:
    assert not relayed_paths("/api/control-plane/restart")
    assert relayed_paths("/api/cluster/restart")


async def test_asked_to_restart_a_control_plane_stops_cleanly_and_hands_its_socket_to_the_next_start(
    tmp_path: Path,
) -> None:
    os.environ.pop(HTTP_FD_ENV, None)
    port = free_port()
    config = await asyncio.to_thread(  # it opens the store with a loop of its own
        lambda: initialise(
            tmp_path,
            name="cp1",
            http_host="127.0.0.1",
            http_port=port,
            agent_host="127.0.0.1",
            agent_port=free_port(),
        )
    )
    token = (tmp_path / "admin.token").read_text().strip()
    plane = ControlPlane(config)
    running = asyncio.create_task(plane.run(asyncio.Event()))
    taken: socket.socket | None = None
    try:
        await asyncio.wait_for(plane.ready.wait(), 30)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            assert (await client.get("/healthz")).json()["instance"] == INSTANCE
            answer = await client.post(
                "/api/control-plane/restart",
                json={"reason": "test"},
                headers={"Authorization": f"Bearer {token}"},
            )
        assert answer.status_code == 202 and answer.json() == {"name": "cp1", "instance": INSTANCE}
        await asyncio.wait_for(running, 30)  # the run ends, cleanly, for the restart
        assert plane.restarting
        taken = inherited_socket("127.0.0.1", port)  # what the next start serves on
        assert taken is not None
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            pass  # still listening between the two starts
    finally:
        running.cancel()
        if taken is not None:
            taken.close()
        os.environ.pop(HTTP_FD_ENV, None)
