"""The last word on each workflow ComfyUI runs for the gate, from ComfyUI's websocket.

ComfyUI (``server.py``, ``execution.py``, ``main.py``) sends a client its
messages as ``{"type": T, "data": {...}}`` text frames on ``/ws?clientId=ID``,
for every prompt queued with that ``client_id``:

- ``status`` ``{"status": {"exec_info": {"queue_remaining": N}}, "sid"?}``;
- ``execution_start`` ``{"prompt_id", "timestamp"}``;
- ``execution_cached`` ``{"nodes": [...], "prompt_id", "timestamp"}``;
- ``executing`` ``{"node", "display_node", "prompt_id"}``; ``node`` null
  once the prompt is over, failed or not (so it settles nothing: a run whose
  end the socket missed is settled from ``/history``);
- ``progress`` ``{"value", "max", "prompt_id", "node"}`` per sampler step;
- ``executed`` ``{"node", "display_node", "output", "prompt_id"}``, the
  output holding lists of ``{"filename", "subfolder", "type"}``;
- ``execution_success`` ``{"prompt_id", "timestamp"}``;
- ``execution_error`` ``{"prompt_id", "node_id", "node_type",
  "exception_message", "exception_type", ...}``;
- ``execution_interrupted`` ``{"prompt_id", "node_id", "node_type", ...}``;
- ``progress_state`` ``{"prompt_id", "nodes"}`` (each node's state), ignored.

``GET /history/{prompt_id}`` keeps the run's ``execution_*`` messages as
``[type, data]`` pairs in ``status.messages``; a failure read there says what
the socket's would. Shapes as ComfyUI 0.3.64 sends them:
``tests/engines/data/comfyui-0.3.64-*``.

Binary frames (previews) are ignored. :class:`Progress` keeps, per prompt,
what the gate answers on ``/progress/{prompt_id}``.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

QUEUED, RUNNING, DONE, FAILED = "queued", "running", "done", "failed"
KEPT = 10_000
"""Prompts remembered at most; the oldest over are forgotten first."""


@dataclass
class PromptState:
    prompt_id: str
    state: str = QUEUED
    node: str | None = None
    step: int = 0
    steps: int = 0
    error: str | None = None
    outputs: list[dict[str, str]] = field(default_factory=list)

    def view(self, ahead: int = 0) -> dict[str, Any]:
        """The ``/progress/{prompt_id}`` answer."""
        if self.state == DONE:
            percent = 100.0
        elif self.state == RUNNING and self.steps:
            percent = round(100.0 * min(self.step, self.steps) / self.steps, 1)
        else:
            percent = 0.0
        return {
            "prompt_id": self.prompt_id,
            "state": self.state,
            "ahead": ahead if self.state == QUEUED else 0,
            "node": self.node,
            "step": self.step,
            "steps": self.steps,
            "percent": percent,
            "error": self.error,
            "outputs": list(self.outputs),
        }


def output_files(output: Any) -> list[dict[str, str]]:
    """The files in a node's ``output`` (``{"images": [{"filename", "subfolder", "type"}], ...}``)."""
    found: list[dict[str, str]] = []
    if not isinstance(output, dict):
        return found
    for items in output.values():
        if not isinstance(items, list):
            continue
        for item in items:
            if isinstance(item, dict) and isinstance(item.get("filename"), str):
                found.append(
                    {
                        "filename": item["filename"],
                        "subfolder": str(item.get("subfolder", "")),
                        "type": str(item.get("type", "output")),
                    }
                )
    return found


def failure(error: dict[str, Any]) -> str:
    """What an ``execution_error`` says, from the socket or from ``/history`` alike."""
    node = f"{error.get('node_type', 'a node')} (node {error.get('node_id')})"
    return f"{node} failed: " + str(error.get("exception_message", "")).strip()


class Progress:
    """Every prompt the gate queued, in its last known state."""

    def __init__(self, kept: int = KEPT) -> None:
        self._prompts: OrderedDict[str, PromptState] = OrderedDict()
        self._kept = kept

    def get(self, prompt_id: str) -> PromptState | None:
        return self._prompts.get(prompt_id)

    def _entry(self, prompt_id: str) -> PromptState:
        entry = self._prompts.get(prompt_id)
        if entry is None:
            entry = self._prompts[prompt_id] = PromptState(prompt_id)
            while len(self._prompts) > self._kept:
                self._prompts.popitem(last=False)
        return entry

    def queued(self, prompt_id: str) -> None:
        """ComfyUI took the prompt (a message about it may have come first: that stays)."""
        self._entry(prompt_id)

    def message(self, message: Any) -> None:
        """Take one of ComfyUI's websocket messages (anything else is ignored)."""
        if not isinstance(message, dict) or not isinstance(message.get("data"), dict):
            return
        kind, data = message.get("type"), message["data"]
        prompt_id = data.get("prompt_id")
        if not isinstance(prompt_id, str) or prompt_id not in self._prompts:
            return  # only the gate's own prompts (and never a stray one filling the memory)
        entry = self._prompts[prompt_id]
        if entry.state in (DONE, FAILED):
            return
        if kind == "execution_start":
            entry.state = RUNNING
        elif kind == "executing":
            if data.get("node") is None:
                entry.node = None  # over, but not necessarily done: execution_success says that
            else:
                entry.state, entry.node = RUNNING, str(data["node"])  # step: the last sampler's, never back
        elif kind == "progress":
            entry.state = RUNNING
            entry.node = str(data.get("node")) if data.get("node") is not None else entry.node
            entry.step, entry.steps = int(data.get("value", 0)), int(data.get("max", 0))
        elif kind == "executed":
            entry.outputs.extend(output_files(data.get("output")))
        elif kind == "execution_success":
            entry.state, entry.node = DONE, None
        elif kind == "execution_error":
            entry.state, entry.error = FAILED, failure(data)
        elif kind == "execution_interrupted":
            entry.state, entry.error = FAILED, "interrupted"

    def cancelled(self, prompt_id: str) -> None:
        """Taken out of ComfyUI's queue before it ran."""
        entry = self._prompts.get(prompt_id)
        if entry is not None and entry.state == QUEUED:
            entry.state, entry.error = FAILED, "cancelled before it ran"

    def from_history(self, prompt_id: str, record: Any) -> None:
        """Settle a prompt from its ``/history`` record (when the websocket missed its end)."""
        entry = self._prompts.get(prompt_id)
        if entry is None or entry.state in (DONE, FAILED) or not isinstance(record, dict):
            return
        status = record.get("status") or {}
        files = [f for output in (record.get("outputs") or {}).values() for f in output_files(output)]
        if status.get("status_str") == "success":
            entry.state, entry.node, entry.outputs = DONE, None, files
            return
        entry.state = FAILED
        for message in status.get("messages") or []:
            if not (isinstance(message, list) and len(message) == 2 and isinstance(message[1], dict)):
                continue
            if message[0] == "execution_interrupted":
                entry.error = "interrupted"
            elif message[0] == "execution_error":
                entry.error = failure(message[1])
        entry.error = entry.error or "failed"
