"""The port's first call: a serving plane's gateway paths straight to the gateway, the rest to the edge."""

from __future__ import annotations

from typing import Any

import pytest

from llmgw.controlplane.serving.front import gateway_first


async def _called(serving: bool, scope: dict[str, Any]) -> list[str]:
    calls: list[str] = []

    async def gateway(scope: dict[str, Any], receive: Any, send: Any) -> None:
        calls.append("gateway")

    async def edge(scope: dict[str, Any], receive: Any, send: Any) -> None:
        calls.append("edge")

    await gateway_first(gateway, edge, lambda: serving)(scope, None, None)
    return calls


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/models", "/rerank"])
async def test_a_serving_planes_gateway_path_skips_the_edge(path: str) -> None:
    assert await _called(True, {"type": "http", "path": path}) == ["gateway"]


@pytest.mark.parametrize(
    ("serving", "scope"),
    [
        (False, {"type": "http", "path": "/v1/chat/completions"}),  # a standby relays it
        (True, {"type": "http", "path": "/api/models"}),  # the admin API's token and body limit
        (True, {"type": "websocket", "path": "/v1/realtime"}),
        (True, {"type": "lifespan"}),
    ],
)
async def test_everything_else_takes_the_whole_edge(serving: bool, scope: dict[str, Any]) -> None:
    assert await _called(serving, scope) == ["edge"]
