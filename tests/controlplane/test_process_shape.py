"""A control plane is built before it serves: an HTTP port that cannot be bound stops it before any
component runs, saying what to do."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import pytest

from llmgw.cli.server import initialise
from llmgw.controlplane.running import ControlPlane
from llmgw.errors import ConfigError
from llmgw.testing.postgres import free_port


async def test_a_control_plane_whose_http_port_is_taken_stops_before_any_component_runs(
    tmp_path: Path,
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
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
        plane = ControlPlane(config)
        with pytest.raises(ConfigError, match=f"cannot serve HTTP on 127.0.0.1:{port}") as caught:
            await asyncio.wait_for(plane.run(asyncio.Event()), 30)
    assert "free that port" in caught.value.hint
    assert plane.supervisor.health() == [] and not plane.ready.is_set()
