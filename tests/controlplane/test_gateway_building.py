"""One gateway builder for the control plane and its workers: every ``gateway.*`` setting reaches both."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, get_args

from pydantic import BaseModel

from llmgw.controlplane.config import GatewaySettingsFile, ServerConfig
from llmgw.controlplane.serving.gatewaybuilding import Outbox, build_gateway
from llmgw.controlplane.serving.responsebook import StoreResponseBook
from llmgw.controlplane.serving.workerserving import build_worker
from llmgw.gateway.response_store import ResponseStore
from llmgw.gateway.settings import GatewaySettings
from llmgw.gateway.usage import UsageRecord
from llmgw.observability.tracing import TRACING_OFF
from llmgw.runtime.processes import Process
from llmgw.store import Store
from llmgw.testing.cluster import free_port
from llmgw.testing.eventually import eventually

SHARED = sorted(GatewaySettingsFile.model_fields.keys() & GatewaySettings.model_fields.keys())
"""The settings of server.yaml's ``gateway`` section that the gateway itself takes."""


def _not_default(name: str) -> Any:
    field = GatewaySettingsFile.model_fields[name]
    default = field.default_factory() if field.default_factory is not None else field.default
    if isinstance(default, BaseModel):  # a group of settings: each of them changed
        fields = type(default).model_fields
        return default.model_copy(
            update={n: _changed(v, fields[n].annotation) for n, v in default.model_dump().items()}
        )
    return _changed(default)


def _changed(default: Any, annotation: Any = None) -> Any:
    if isinstance(default, bool):
        return not default
    if isinstance(default, str):  # one of a Literal's values: another of them; else a path
        others = [value for value in get_args(annotation) if value != default]
        return others[0] if others else default + "/etc/llmgw/changed.pem"
    return default * 2 + 1


def _config(tmp_path: Path, **gateway: Any) -> ServerConfig:
    values = {name: _not_default(name) for name in SHARED}
    return ServerConfig(data_dir=str(tmp_path), gateway={**values, **gateway})


def _settings_of(settings: GatewaySettings) -> dict[str, Any]:
    return {name: getattr(settings, name) for name in SHARED}


def test_the_shared_settings_include_those_of_jobs_and_files() -> None:
    assert {
        "job_poll_s",
        "job_timeout_s",
        "jobs_kept",
        "job_kept_s",
        "files_kept_s",
        "files_max_bytes",
    } <= set(SHARED)


def test_every_gateway_setting_of_server_yaml_reaches_the_control_planes_gateway(tmp_path: Path) -> None:
    config = _config(tmp_path)
    gateway = build_gateway(config, Outbox(), TRACING_OFF)
    assert _settings_of(gateway.settings) == {name: _not_default(name) for name in SHARED}
    assert gateway.limiter.plane == "cp1" and gateway.limiter.share == 1.0


def test_without_a_client_store_responses_are_kept_in_the_gateway_s_memory_as_configured(
    tmp_path: Path,
) -> None:
    config = _config(tmp_path)
    book = build_gateway(config, Outbox(), TRACING_OFF).responses
    assert isinstance(book, ResponseStore)
    g = config.gateway
    assert (book.ttl_s, book.per_key, book.total) == (
        g.responses_kept_s,
        g.responses_per_key,
        g.responses_total,
    )


async def test_given_the_client_store_the_gateway_keeps_responses_there(tmp_path: Path) -> None:
    config = _config(tmp_path)
    async with await Store.open(config.store_url) as clients:
        book = build_gateway(config, Outbox(), TRACING_OFF, clients=clients).responses
        assert isinstance(book, StoreResponseBook)
        assert (book.ttl_s, book.per_key) == (
            config.gateway.responses_kept_s,
            config.gateway.responses_per_key,
        )


async def test_a_workers_gateway_has_the_job_and_file_settings_of_server_yaml(tmp_path: Path) -> None:
    config = _config(tmp_path, workers=4)
    process = Process()
    async with process.closing:
        parts = await build_worker(config, free_port(), 0, process)
        assert _settings_of(parts.gateway.settings) == {name: _not_default(name) for name in SHARED}
        assert parts.gateway.files.ttl_s == config.gateway.files_kept_s
        assert isinstance(parts.gateway.responses, StoreResponseBook)
        assert parts.gateway.limiter.share == 0.25 and parts.gateway.limiter.plane == "cp1"


class _Leader:
    def __init__(self) -> None:
        self.told: list[tuple[str, object]] = []

    def request(self, request: dict[str, Any]) -> None:
        self.told.append(("request", request))

    def used(self, model: str) -> None:
        self.told.append(("used", model))

    def usage(self, record: UsageRecord) -> None:
        self.told.append(("usage", record))


async def test_the_outbox_hands_what_it_kept_in_order_then_each_request_as_it_comes() -> None:
    outbox = Outbox()
    outbox.request({"kind": "wanted", "model": "m"})
    outbox.used("m")
    leader = _Leader()
    running = asyncio.create_task(outbox.run(leader))
    await eventually(lambda: leader.told == [("request", {"kind": "wanted", "model": "m"}), ("used", "m")])
    outbox.used("n")
    assert leader.told[-1] == ("used", "n")  # at once, while it runs
    running.cancel()
    await asyncio.gather(running, return_exceptions=True)
    outbox.used("o")
    assert leader.told[-1] == ("used", "n")  # kept again once it stopped
