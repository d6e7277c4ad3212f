"""The gateway's client to a ComfyUI replica's gate (``llmgw comfyui-gate``).

The gate answers on the replica's port, demands the replica's key and lets
through only what is asked here: queueing a workflow (``POST /prompt``, as
ComfyUI takes it), its progress (``GET /progress/{prompt_id}``: the gate's
last word from ComfyUI's websocket), its files (``GET /view``) and cancelling
(``POST /queue`` with ``delete``, ``POST /interrupt``). Every failure to reach
it, or an answer that is not what the gate gives, is a :class:`GateError`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from llmgw.errors import EngineError
from llmgw.gateway.api_errors import ApiError
from llmgw.gateway.replicas import ReplicaEndpoint
from llmgw.gateway.settings import GatewaySettings

STATES = ("queued", "running", "done", "failed")


class GateError(EngineError):
    """The gate could not be reached, or answered what it never answers."""


@dataclass(frozen=True, slots=True)
class OutputFile:
    """A file a workflow saved, as ComfyUI's ``/view`` names it."""

    filename: str
    subfolder: str = ""
    type: str = "output"


@dataclass(frozen=True, slots=True)
class Progress:
    """One workflow's state on its gate (``GET /progress/{prompt_id}``)."""

    state: str
    ahead: int = 0
    node: str | None = None
    step: int = 0
    steps: int = 0
    percent: float = 0.0
    error: str | None = None
    outputs: tuple[OutputFile, ...] = field(default=())

    @staticmethod
    def parse(data: Any) -> Progress:
        if not isinstance(data, dict) or data.get("state") not in STATES:
            raise GateError(f"the gate's progress answer is not one it gives: {str(data)[:200]}")
        outputs = tuple(
            OutputFile(str(o["filename"]), str(o.get("subfolder") or ""), str(o.get("type") or "output"))
            for o in data.get("outputs") or ()
            if isinstance(o, dict) and o.get("filename")
        )
        node = data.get("node")
        error = data.get("error")
        return Progress(
            state=data["state"],
            ahead=int(data.get("ahead") or 0),
            node=None if node is None else str(node),
            step=int(data.get("step") or 0),
            steps=int(data.get("steps") or 0),
            percent=float(data.get("percent") or 0.0),
            error=None if error is None else str(error),
            outputs=outputs,
        )


class GateClient:
    """Calls to gates, over one pooled aiohttp session made on first use."""

    def __init__(self, settings: GatewaySettings) -> None:
        self._settings = settings
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            timeout = aiohttp.ClientTimeout(
                sock_connect=self._settings.connect_timeout_s, sock_read=self._settings.upstream_timeout_s
            )
            self._session = aiohttp.ClientSession(timeout=timeout)
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def _call(
        self, endpoint: ReplicaEndpoint, method: str, path: str, body: Any = None, params: Any = None
    ) -> tuple[int, bytes]:
        headers = {"Authorization": f"Bearer {endpoint.api_key}"}
        try:
            async with self._client().request(
                method, endpoint.base_url + path, json=body, params=params, headers=headers
            ) as response:
                return response.status, await response.read()
        except (aiohttp.ClientError, TimeoutError) as error:
            raise GateError(
                f"replica {endpoint.replica_id} at {endpoint.base_url} did not answer {method} {path}: "
                f"{str(error) or type(error).__name__}"
            ) from error

    async def queue(self, endpoint: ReplicaEndpoint, graph: dict[str, Any]) -> str:
        """Queue ``graph`` (``POST /prompt``); its prompt id. A workflow ComfyUI refuses is a 400."""
        status, raw = await self._call(endpoint, "POST", "/prompt", {"prompt": graph})
        data = _json(raw)
        if status == 400 and isinstance(data, dict) and (missing := missing_node(data)) is not None:
            kind, node = missing
            raise ApiError(
                502,
                f"replica {endpoint.replica_id}'s ComfyUI has no node class {kind!r} (node {node} of the "
                "model's workflow): a custom node the workflow needs is not installed there; add the "
                "custom node providing it to the model's comfyui.nodes (its repository and commit) and "
                "the replica installs it when it starts again",
                "custom_node_missing",
            )
        if status == 400 and isinstance(data, dict):
            raise ApiError(
                400,
                f"The workflow was refused with these inputs: {_refusal(data)}",
                "invalid_input",
                "inputs",
            )
        if status != 200 or not isinstance(data, dict) or not isinstance(data.get("prompt_id"), str):
            raise GateError(
                f"replica {endpoint.replica_id} answered POST /prompt with {status}: {raw[:200]!r}"
            )
        prompt_id: str = data["prompt_id"]
        return prompt_id

    async def progress(self, endpoint: ReplicaEndpoint, prompt_id: str) -> Progress:
        status, raw = await self._call(endpoint, "GET", f"/progress/{prompt_id}")
        if status != 200:
            raise GateError(f"replica {endpoint.replica_id} answered /progress with {status}: {raw[:200]!r}")
        return Progress.parse(_json(raw))

    async def view(self, endpoint: ReplicaEndpoint, output: OutputFile) -> bytes:
        params = {"filename": output.filename, "subfolder": output.subfolder, "type": output.type}
        status, raw = await self._call(endpoint, "GET", "/view", params=params)
        if status != 200:
            raise GateError(
                f"replica {endpoint.replica_id} answered /view of {output.filename} with {status}"
            )
        return raw

    async def cancel(self, endpoint: ReplicaEndpoint, prompt_id: str, running: bool) -> None:
        """Take a queued workflow off the queue; interrupt it when it runs (named, so no other is)."""
        await self._call(endpoint, "POST", "/queue", {"delete": [prompt_id]})
        if running:
            await self._call(endpoint, "POST", "/interrupt", {"prompt_id": prompt_id})


def _json(raw: bytes) -> Any:
    try:
        return json.loads(raw) if raw else None
    except (ValueError, UnicodeDecodeError):
        return None


_NO_SUCH_NODE = re.compile(r"Cannot execute because node (.+) does not exist\.")


def missing_node(data: dict[str, Any]) -> tuple[str, str] | None:
    """The class and node id a refusal of ComfyUI's says no node registers: ``missing_node_type``
    (since ComfyUI's PR #12194) or, before it, ``invalid_prompt`` "node X does not exist"; else None."""
    error = data.get("error")
    if not isinstance(error, dict):
        return None
    extra = error.get("extra_info")
    node = str(error.get("details") or "").removeprefix("Node ID '#").removesuffix("'")
    if error.get("type") == "missing_node_type" and isinstance(extra, dict) and extra.get("class_type"):
        return str(extra["class_type"]), str(extra.get("node_id") or node)
    old = _NO_SUCH_NODE.fullmatch(str(error.get("message") or ""))
    if error.get("type") == "invalid_prompt" and old is not None:
        return old.group(1), node
    return None


def _refusal(data: dict[str, Any]) -> str:
    """ComfyUI's refusal (``error`` and ``node_errors``) in one line."""
    error = data.get("error")
    parts = [str(error.get("message") if isinstance(error, dict) else error or "refused")]
    nodes = data.get("node_errors")
    if isinstance(nodes, dict):
        for node, info in nodes.items():
            for item in (info.get("errors") if isinstance(info, dict) else None) or ():
                if isinstance(item, dict):
                    parts.append(f"node {node}: {item.get('message', '')} {item.get('details', '')}".strip())
    return "; ".join(parts)[:1000]
