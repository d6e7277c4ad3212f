"""The ComfyUI stand-in's queue and its worker: one workflow at a time, messages as ComfyUI sends them.

Shapes follow ComfyUI 0.3.64's ``execution.py`` (``PromptQueue``,
``PromptExecutor``), ``main.py`` (``prompt_worker``, ``hijack_progress``) and
``comfy_execution/`` (``progress.py``'s ``progress_state``, ``graph.py``'s
order of nodes), held to ``tests/engines/data/comfyui-0.3.64-*``: queue items
are ``(number, prompt_id, prompt, extra_data, outputs_to_execute)``; a history
record is ``{"prompt": item, "outputs": {node: ui}, "status": {"status_str",
"completed", "messages"}, "meta": {node: {...}}}``.
"""

from __future__ import annotations

import asyncio
import heapq
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from llmgw.testing.comfyui_standin_nodes import (
    CORE_NODES,
    OUTPUT_NODES,
    STANDIN_NODES,
    is_mesh_output,
    is_output,
    refusal,
)
from llmgw.testing.standin_media import obj_text, png_bytes

Item = tuple[int | float, str, dict[str, Any], dict[str, Any], list[str]]
UNSTEPPED_SAMPLER_STEPS = 8


@dataclass
class Settings:
    base: Path
    directories: dict[str, Path]
    """``output``, ``temp`` and ``input``: where ``/view`` reads by ``type``."""
    step_s: float = 0.05
    nodes: tuple[str, ...] = CORE_NODES + STANDIN_NODES
    """The classes it knows (custom nodes' added by ``main``)."""
    interrupt_by_id: bool = True
    """``POST /interrupt {"prompt_id"}`` interrupts only that workflow, as ComfyUI does from 0.3.57
    (its PR #9607); False: whatever runs, as every release before it."""
    missing_node_type: bool = False
    """Refuse a class nobody registers as ComfyUI does since its PR #12194 (``missing_node_type``,
    a release later than the one imitated); False: as 0.3.64 (``invalid_prompt``)."""


class Interrupted(Exception):
    pass


class NodeFailed(Exception):
    pass


@dataclass
class Runner:
    settings: Settings
    pending: list[Item] = field(default_factory=list)
    running: list[Item] = field(default_factory=list)
    history: dict[str, dict[str, Any]] = field(default_factory=dict)
    sockets: dict[str, web.WebSocketResponse] = field(default_factory=dict)
    interrupted: bool = False
    number: int = 0
    client_id: str | None = None
    """The client of the workflow running (or last run)."""
    last_node: str | None = None
    """The node running, told again to its client's socket when it connects again."""
    states: dict[str, dict[str, Any]] = field(default_factory=dict)
    """The running workflow's nodes started so far: ``state``, ``value``, ``max`` (``progress_state``)."""
    counter: int = 0
    _wake: asyncio.Event = field(default_factory=asyncio.Event)
    _outbox: asyncio.Queue[tuple[dict[str, Any], str | None]] = field(default_factory=asyncio.Queue)

    # the queue -------------------------------------------------------------
    def queue_info(self) -> dict[str, Any]:
        return {"exec_info": {"queue_remaining": len(self.pending) + len(self.running)}}

    def next_number(self, front: bool) -> int:
        number = -self.number if front else self.number
        self.number += 1
        return number

    def validate(self, prompt: Any) -> dict[str, Any] | None:
        """ComfyUI's ``validate_prompt`` errors the stand-in can tell; None when it runs."""
        return refusal(prompt, set(self.settings.nodes), self.settings.missing_node_type)

    @staticmethod
    def outputs_of(prompt: dict[str, Any]) -> list[str]:
        return [n for n, node in prompt.items() if is_output(node["class_type"])]

    def running_ids(self) -> set[str]:
        return {item[1] for item in self.running}

    def put(self, item: Item) -> None:
        heapq.heappush(self.pending, item)
        self.queue_updated()
        self._wake.set()

    def delete(self, prompt_id: str) -> None:
        for index, item in enumerate(self.pending):
            if item[1] == prompt_id:
                self.pending.pop(index)
                heapq.heapify(self.pending)
                self.queue_updated()
                return

    def queue_updated(self) -> None:
        self.send("status", {"status": self.queue_info()}, None)

    # messages --------------------------------------------------------------
    def send(self, event: str, data: dict[str, Any], sid: str | None) -> None:
        """Queue a message for ``sid`` (all sockets when None); sent in order, as ComfyUI does."""
        self._outbox.put_nowait(({"type": event, "data": data}, sid))

    async def publish(self) -> None:
        while True:
            message, sid = await self._outbox.get()
            targets = (
                list(self.sockets.values())
                if sid is None
                else [self.sockets[sid]]
                if sid in self.sockets
                else []
            )
            for ws in targets:
                if not ws.closed:
                    try:
                        await ws.send_json(message)
                    except (ConnectionError, RuntimeError):
                        pass

    def add_message(
        self, messages: list[list[Any]], event: str, data: dict[str, Any], sid: str | None, broadcast: bool
    ) -> None:
        data = {**data, "timestamp": int(time.time() * 1000)}
        messages.append([event, data])
        if sid is not None or broadcast:
            self.send(event, data, sid)

    # the worker ------------------------------------------------------------
    async def work(self) -> None:
        while True:
            while not self.pending:
                self._wake.clear()
                await self._wake.wait()
            item = heapq.heappop(self.pending)
            self.running.append(item)
            self.queue_updated()
            outputs, status = await self.execute(item)
            self.running.remove(item)
            meta = {
                n: {"node_id": n, "display_node": n, "parent_node": None, "real_node_id": n} for n in outputs
            }
            self.history[item[1]] = {"prompt": list(item), "outputs": outputs, "status": status, "meta": meta}
            self.queue_updated()
            self.last_node = None
            self.send("executing", {"node": None, "prompt_id": item[1]}, item[3].get("client_id"))

    def progress_state(self, prompt_id: str, sid: str | None) -> None:
        """``progress_state``: every node started so far, its state and its steps."""
        nodes = {
            node: {**state, "node_id": node, "prompt_id": prompt_id, "display_node_id": node,
                   "parent_node_id": None, "real_node_id": node}
            for node, state in self.states.items()
        }  # fmt: skip
        self.send("progress_state", {"prompt_id": prompt_id, "nodes": nodes}, sid)

    async def execute(self, item: Item) -> tuple[dict[str, Any], dict[str, Any]]:
        _, prompt_id, prompt, extra, outputs_to_execute = item
        sid = extra.get("client_id")
        self.interrupted, self.client_id = False, sid
        self.states = {}
        messages: list[list[Any]] = []
        self.add_message(messages, "execution_start", {"prompt_id": prompt_id}, sid, False)
        self.add_message(messages, "execution_cached", {"nodes": [], "prompt_id": prompt_id}, sid, False)
        outputs: dict[str, Any] = {}
        executed: list[str] = []
        node_id = ""
        try:
            for node_id in execution_order(prompt, outputs_to_execute):
                node = prompt[node_id]
                self.states[node_id] = {"value": 0.0, "max": 1.0, "state": "running"}
                self.progress_state(prompt_id, sid)
                self.last_node = node_id
                self.send(
                    "executing", {"node": node_id, "display_node": node_id, "prompt_id": prompt_id}, sid
                )
                ui = await self.run_node(prompt_id, node_id, node, prompt, sid)
                executed.append(node_id)
                if ui is not None:
                    outputs[node_id] = ui
                    self.send(
                        "executed",
                        {"node": node_id, "display_node": node_id, "output": ui, "prompt_id": prompt_id},
                        sid,
                    )
                state = self.states[node_id]
                state.update(state="finished", value=state["max"])
                self.progress_state(prompt_id, sid)
        except Interrupted:
            mes = {
                "prompt_id": prompt_id,
                "node_id": node_id,
                "node_type": prompt[node_id]["class_type"],
                "executed": executed,
            }
            self.add_message(messages, "execution_interrupted", mes, sid, True)
            return outputs, {"status_str": "error", "completed": False, "messages": messages}
        except NodeFailed as failure:
            mes = {
                "prompt_id": prompt_id,
                "node_id": node_id,
                "node_type": prompt[node_id]["class_type"],
                "executed": executed,
                "exception_message": str(failure),
                "exception_type": "RuntimeError",
                "traceback": [],
                "current_inputs": {},
                "current_outputs": [],
            }
            self.add_message(messages, "execution_error", mes, sid, False)
            return outputs, {"status_str": "error", "completed": False, "messages": messages}
        self.add_message(messages, "execution_success", {"prompt_id": prompt_id}, sid, False)
        return outputs, {"status_str": "success", "completed": True, "messages": messages}

    async def run_node(
        self, prompt_id: str, node_id: str, node: dict[str, Any], prompt: dict[str, Any], sid: str | None
    ) -> dict[str, Any] | None:
        kind, inputs = node["class_type"], node.get("inputs", {})
        if kind == "StandinFail":
            raise NodeFailed(str(inputs.get("message", "the stand-in was told to fail")))
        steps = inputs.get("steps")
        if not isinstance(steps, int):
            steps = UNSTEPPED_SAMPLER_STEPS if kind.endswith("Sampler") else 0
        for step in range(1, steps + 1):
            await asyncio.sleep(self.settings.step_s)
            if self.interrupted:
                raise Interrupted()
            self.states[node_id].update(value=step, max=steps)
            self.progress_state(prompt_id, sid)
            self.send("progress", {"value": step, "max": steps, "prompt_id": prompt_id, "node": node_id}, sid)
        if self.interrupted:
            raise Interrupted()
        text = " ".join(str(n.get("inputs", {}).get("text", "")) for n in prompt.values())
        if kind in OUTPUT_NODES:
            return {"images": self.save_pictures(kind, inputs, prompt, text)}
        if is_mesh_output(kind):
            return {"mesh": [self.save_file("meshsave", "obj", obj_text(text).encode(), "output")]}
        return None

    def save_pictures(
        self, kind: str, inputs: dict[str, Any], prompt: dict[str, Any], text: str
    ) -> list[dict[str, str]]:
        width, height, batch = 64, 64, 1
        for node in prompt.values():
            given = node.get("inputs", {})
            if isinstance(given.get("width"), int) and isinstance(given.get("height"), int):
                width, height = given["width"], given["height"]
                batch = given.get("batch_size", 1) if isinstance(given.get("batch_size"), int) else 1
        kind_dir = "output" if kind == "SaveImage" else "temp"
        prefix = str(inputs.get("filename_prefix", "ComfyUI"))
        return [
            self.save_file(prefix, "png", png_bytes(width, height, f"{text}#{i}"), kind_dir)
            for i in range(batch)
        ]

    def save_file(self, prefix: str, suffix: str, data: bytes, kind: str) -> dict[str, str]:
        directory = self.settings.directories[kind]
        subfolder, _, name = prefix.rpartition("/")
        (directory / subfolder).mkdir(parents=True, exist_ok=True)
        self.counter += 1
        filename = f"{name}_{self.counter:05}_.{suffix}"
        (directory / subfolder / filename).write_bytes(data)
        return {"filename": filename, "subfolder": subfolder, "type": kind}


def execution_order(prompt: dict[str, Any], outputs: list[str]) -> list[str]:
    """The order ComfyUI runs ``prompt``'s nodes in (``comfy_execution/graph.py``): the nodes the
    outputs need, each once its inputs' nodes ran, picking among those ready an output first, then
    one an output waits on, then one two steps from an output, else the first ready."""
    pending: dict[str, None] = {}
    waits: dict[str, int] = {}
    blocking: dict[str, set[str]] = {}
    for output in outputs:
        stack, links = [output], []
        while stack:
            node_id = stack.pop()
            if node_id in pending or node_id not in prompt:
                continue
            pending[node_id], waits[node_id], blocking[node_id] = None, 0, set()
            for value in prompt[node_id].get("inputs", {}).values():
                if isinstance(value, list) and len(value) == 2 and isinstance(value[0], str):
                    stack.append(value[0])
                    links.append((value[0], node_id))
        for source, target in links:
            if source in blocking and target not in blocking[source]:
                blocking[source].add(target)
                waits[target] += 1

    def saves(node_id: str) -> bool:
        return is_output(prompt[node_id]["class_type"])

    done: list[str] = []
    while pending:
        ready = [n for n in pending if waits[n] == 0]
        if not ready:
            break  # a cycle: ComfyUI refuses it before it runs
        chosen = (
            next((n for n in ready if saves(n)), None)
            or next((n for n in ready if any(saves(b) for b in blocking[n])), None)
            or next((n for n in ready if any(saves(c) for b in blocking[n] for c in blocking[b])), None)
            or ready[0]
        )
        done.append(chosen)
        del pending[chosen]
        for blocked in blocking.pop(chosen):
            waits[blocked] -= 1
    return done
