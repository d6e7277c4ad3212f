"""A real admin API on a loopback port (uvicorn in a thread) for the commands to talk to."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from llmgw.controlplane.nodes.fleet import Fleet, ReplicaState
from llmgw.core.health import ComponentHealth, ComponentState
from llmgw.testing.admin import admin_app, empty_fleet
from llmgw.testing.serving import served_in_thread

TOKEN = "llmgw-admin-cli-test"
FAILED_AT = 1_700_000_000.0


@dataclass
class AdminServer:
    url: str
    token: str
    fleet: Fleet

    def options(self) -> list[str]:
        return ["--url", self.url, "--token", self.token]


COMPONENTS = [
    ComponentHealth("reconciler", ComponentState.RUNNING),
    ComponentHealth("load-reader", ComponentState.RESTARTING, 2, "OSError: connection refused", FAILED_AT),
    ComponentHealth("usage-writer", ComponentState.FAILED, 5, "StoreUnavailable: gone", FAILED_AT + 60),
]


@pytest.fixture
def admin_server(tmp_path: Path) -> Iterator[AdminServer]:
    fleet = empty_fleet()
    fleet.track(ReplicaState("r-1", "m1", "node1", "k", state="ready", port=9001, compute="cpu"))
    opened = lambda: admin_app(tmp_path, token=TOKEN, fleet=fleet, components=lambda: COMPONENTS)  # noqa: E731
    with served_in_thread(opened) as url:
        yield AdminServer(url, TOKEN, fleet)
