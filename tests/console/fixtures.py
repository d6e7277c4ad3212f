"""Fixed cluster data in the shapes the admin routes answer, and a source that serves it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from llmgw.adminapi.schemas import KeyCreated, ModelEntry, RestartAnswer, ServingView
from llmgw.console.events import Event, Notice

NOW = 1_700_000_600.0
"""The console's wall clock in these tests."""
SHA = "ab" * 32

STATUS: dict[str, Any] = {
    "name": "cp1",
    "version": "0.1.0",
    "leader": "cp1",
    "standbys": ["cp2"],
    "control_planes": [
        {
            "name": "cp1",
            "role": "leader",
            "http": "10.0.0.1:8080",
            "agents": "10.0.0.1:8443",
            "seen_ago_s": 1,
        },
        {
            "name": "cp2",
            "role": "standby",
            "http": "10.0.0.2:8080",
            "agents": "10.0.0.2:8443",
            "seen_ago_s": 2,
        },
    ],
    "vip": "10.0.0.100/24",
    "vip_on_leader": True,
    "stopped": False,
    "nodes": 2,
    "models": 2,
    "replicas": 3,
    "replicas_ready": 1,
    "unplaced": {"big": "no node has 80000 MiB free on an a100-80g"},
    "components": [
        {"name": "reconciler", "state": "running"},
        {
            "name": "usage-writer",
            "state": "failed",
            "restarts": 5,
            "last_error": "StoreUnavailable: gone",
            "last_error_at": NOW - 60,
        },
    ],
    "refused_settings": {
        "gpu1": {
            "settings": "work_dir: /proc/x\n",
            "keys": "work_dir=/proc/x",
            "reason": "cannot write /proc/x",
            "refused_at": NOW - 30,
        }
    },
}
NODES: list[dict[str, Any]] = [
    {
        "id": "gpu1",
        "connected": True,
        "address": "10.0.1.1",
        "cpu_cores": 64,
        "memory_mb": 515000,
        "gpus": [
            {"index": 1, "name": "NVIDIA H100 80GB HBM3", "class": "h100-80g", "memory_mb": 81559},
            {"index": 1001, "name": "NVIDIA A100 MIG 3g.40gb", "class": "a100-3g.40gb", "memory_mb": 40192},
        ],
        "engines": ["llama.cpp b4000", "vllm 0.9.1"],
        "replicas": 2,
    },
    {
        "id": "cpu1",
        "connected": False,
        "address": "10.0.1.2",
        "cpu_cores": 0,
        "memory_mb": 0,
        "gpus": [],
        "engines": [],
        "replicas": 0,
    },
]
REPLICAS: list[dict[str, Any]] = [
    {"id": "chat-1", "model": "chat", "node": "gpu1", "state": "ready", "port": 21000,
     "on": "cuda:1 16000 MiB", "restarts": 0, "error": ""},
    {"id": "chat-2", "model": "chat", "node": "gpu1", "state": "failed", "port": 0, "on": "",
     "restarts": 5, "error": "engine exited with code 1"},
]  # fmt: skip
MODELS: list[dict[str, Any]] = [
    {"name": "chat", "definition": {"name": "chat", "source": {"sha256": SHA, "filename": "chat.gguf"}},
     "replicas": 2, "ready": 1},
    {"name": "big", "definition": {"name": "big", "source": {"sha256": SHA, "filename": "big.gguf"}},
     "replicas": 0, "ready": 0, "unplaced": "no node has 80000 MiB free"},
]  # fmt: skip
SETTINGS: dict[str, Any] = {"gateway.request_wait_s": 30, "shards.liveness_s": 45}
KEYS: list[dict[str, Any]] = [
    {"id": "k-1", "name": "chat-app", "prefix": "llmgw-ab12", "owner": "web team",
     "created_at": "2026-11-01T10:00:00Z", "revoked_at": None, "place": "project:acme/web/chat"},
]  # fmt: skip
BLOBS: list[dict[str, Any]] = [{"sha256": SHA, "size": 94 << 20, "filename": "chat.gguf", "kind": "weights"}]
HISTORY: list[dict[str, Any]] = [
    {
        "key": "shards.liveness_s",
        "value": 45,
        "deleted": False,
        "at": "2026-11-02T09:00:00Z",
        "actor": "admin",
    },
]
USAGE: dict[str, Any] = {
    "by": "month",
    "group_by": ["key"],
    "lines": [
        {"start": "2026-11-01T00:00:00Z", "key": "k-1", "key_name": "chat-app", "requests": 120,
         "errors": 2, "prompt_tokens": 5000, "completion_tokens": 8000},
    ],
    "limit": 10000,
    "truncated": False,
}  # fmt: skip
TRAINING: list[dict[str, Any]] = [
    {"id": "tj_0123456789ab", "owner": "team:acme/ml", "model": "chat", "state": "training", "node": "any",
     "node_id": "gpu1", "device": "1", "memory_mb": 8000, "step": 40, "steps": 100, "loss": 0.8123,
     "peak_memory_bytes": 6 << 30, "created_at": "2026-11-02T09:00:00Z",
     "updated_at": "2026-11-02T09:05:00Z"},
    {"id": "tj_ba9876543210", "owner": "", "model": "chat", "state": "queued", "node": "any",
     "memory_mb": 90000, "reasons": "gpu1: card 1: 20000 MiB free, the job needs 90000",
     "created_at": "2026-11-02T09:01:00Z", "updated_at": "2026-11-02T09:01:00Z"},
]  # fmt: skip
BATCHES: list[dict[str, Any]] = [
    {"id": "batch_0123456789abcdef01234567", "owner": "project:acme/ml/chat", "key_id": "k-1",
     "endpoint": "/v1/chat/completions", "status": "in_progress", "total": 1000, "completed": 420,
     "failed": 3, "input_tokens": 12000, "output_tokens": 2100, "input_file_id": "file-in",
     "output_file_id": "", "error_file_id": "", "errors": [], "created_at": "2026-11-02T09:00:00Z",
     "expires_at": "2026-11-03T09:00:00Z", "times": {"in_progress": 1762074000.0}},
]  # fmt: skip
METRICS = """\
# TYPE llmgw_gpu_utilization_ratio gauge
llmgw_gpu_utilization_ratio{node="gpu1",device="1",device_class="h100-80g"} 0.87
# TYPE llmgw_gpu_memory_used_bytes gauge
llmgw_gpu_memory_used_bytes{node="gpu1",device="1",device_class="h100-80g"} 6.7108864e+10
llmgw_gpu_memory_used_bytes{node="gpu1",device="0/mig1",device_class="a100-3g.40gb"} 1.048576e+10
# TYPE llmgw_gpu_memory_total_bytes gauge
llmgw_gpu_memory_total_bytes{node="gpu1",device="1",device_class="h100-80g"} 8.5520809984e+10
# TYPE llmgw_gpu_temperature_celsius gauge
llmgw_gpu_temperature_celsius{node="gpu1",device="1",device_class="h100-80g"} 64
"""

STREAMED: dict[str, Any] = {
    "status": STATUS,
    "nodes": NODES,
    "replicas": REPLICAS,
    "models": MODELS,
    "settings": SETTINGS,
    "serving": {"stopped": False},
    "keys": KEYS,
}
FETCHED: dict[str, Any] = {
    "blobs": BLOBS,
    "history": HISTORY,
    "usage": USAGE,
    "gpus": METRICS,
    "training": TRAINING,
    "batches": BATCHES,
}


class FixedSource:
    """A cluster that answers the fixed data, sends every kind once, then what a test puts in ``events``."""

    name = "http://cp1.example:8080"

    def __init__(self) -> None:
        self.events: asyncio.Queue[Event | Notice] = asyncio.Queue()
        self.serving: list[bool] = []

    async def updates(self) -> AsyncIterator[Event | Notice]:
        yield Notice("live: events from " + self.name)
        for kind, data in STREAMED.items():
            yield Event(kind, data)
        while True:
            yield await self.events.get()

    async def fetch(self, kind: str) -> Any:
        return FETCHED[kind] if kind in FETCHED else STREAMED[kind]

    async def create_key(self, name: str, owner: str, place: str) -> KeyCreated:
        return KeyCreated(id="k-2", name=name, key="llmgw-secret")

    async def add_model(self, definition: dict[str, Any]) -> ModelEntry:
        return ModelEntry.model_validate({"name": definition["name"], "definition": definition})

    async def set_serving(self, stopped: bool) -> ServingView:
        self.serving.append(stopped)
        return ServingView(stopped=stopped)

    async def restart_agents(self, reason: str) -> RestartAnswer:
        return RestartAnswer(restarted=["gpu1"])
