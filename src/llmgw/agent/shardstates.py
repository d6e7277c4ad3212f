"""Shard state files: what an agent that restarts needs to adopt an engine still running.

Each shard keeps ``state.json`` (mode 0600: the spec carries the replica's
key) in its directory under the work directory: the spec it was started
from, the engine's command line, its process id and start time, its port,
where it computes and the file its output goes to. The file is written
atomically (a temporary file renamed over it), so a reader sees the old
state or the new one, never half of either.

A process is the shard's engine only when its pid is alive, not a zombie,
and has the start time and command line the file recorded: a pid reused by
another program is never adopted nor signalled.
"""

from __future__ import annotations

import base64
import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from llmgw.core.shards import Compute, ShardSpec
from llmgw.errors import LlmgwError
from llmgw.protocol.shards import shard_spec_bytes, shard_spec_from_bytes

STATE_FILE = "state.json"
FORMAT = 1


class CorruptState(LlmgwError):
    """A state file that cannot be read back."""


@dataclass
class ShardRecord:
    """One shard's state as kept on disk."""

    spec: ShardSpec
    command: list[str] = field(default_factory=list)
    """The engine's argv as it was started; an adopted shard keeps it."""
    pid: int = 0
    start_time: str = ""
    """Field 22 of ``/proc/PID/stat``: the process's start in clock ticks since boot."""
    port: int = 0
    compute: Compute = field(default_factory=Compute)
    restarts: int = 0
    output: str = ""
    """The name of the file in the shard's directory the engine writes to."""
    adapter_paths: dict[str, str] = field(default_factory=dict)
    """Each LoRA adapter's folder or file on the node, by name (the router loads runtime ones by it)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            # without its trace context: an adopted engine's watch is no part of its start's trace
            "spec": base64.b64encode(shard_spec_bytes(replace(self.spec, traceparent=""))).decode(),
            "command": list(self.command),
            "pid": self.pid,
            "start_time": self.start_time,
            "port": self.port,
            "compute": _compute_json(self.compute),
            "restarts": self.restarts,
            "output": self.output,
            "adapter_paths": dict(self.adapter_paths),
        }


def write_state(directory: Path, record: ShardRecord) -> None:
    """Replace ``directory/state.json`` atomically (write, fsync, rename)."""
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / STATE_FILE
    temporary = directory / f".{STATE_FILE}.{os.getpid()}"
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as handle:
        json.dump(record.to_json(), handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, final)


def read_state(directory: Path) -> ShardRecord:
    """The record in ``directory/state.json``; CorruptState saying what is wrong with it."""
    path = directory / STATE_FILE
    hint = f"look at {path}; the control plane starts the replica again once the shard is stopped"
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CorruptState(f"cannot read {path}: {error}", hint) from None
    try:
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"not a format {FORMAT} shard state")
        spec = shard_spec_from_bytes(base64.b64decode(data["spec"], validate=True))
        if not spec.replica_id:
            raise ValueError("its spec names no replica")
        compute = _compute_of(data.get("compute") or {})
        command = data["command"]
        if not isinstance(command, list) or not all(isinstance(part, str) for part in command):
            raise ValueError("command is not a list of strings")
        return ShardRecord(
            spec=spec,
            command=command,
            pid=int(data["pid"]),
            start_time=str(data["start_time"]),
            port=int(data["port"]),
            compute=compute,
            restarts=int(data.get("restarts", 0)),
            output=str(data.get("output", "")),
            adapter_paths={str(k): str(v) for k, v in dict(data.get("adapter_paths") or {}).items()},
        )
    except (KeyError, TypeError, ValueError) as error:
        raise CorruptState(f"{path} is corrupt: {error}", hint) from None


def _compute_json(compute: Compute) -> dict[str, Any]:
    return {
        "backend": compute.backend,
        "devices": list(compute.devices),
        "layers_offloaded": compute.layers_offloaded,
        "memory_mb": compute.memory_mb,
    }


def _compute_of(data: Any) -> Compute:
    """A compute as :func:`_compute_json` wrote it, or as earlier agents did (fields left out when
    empty, ``memory_mb`` as a string)."""
    if not isinstance(data, dict):
        raise ValueError("compute is not a mapping")
    return Compute(
        backend=str(data.get("backend", "")),
        devices=tuple(int(d) for d in data.get("devices") or ()),
        layers_offloaded=int(data.get("layers_offloaded", 0)),
        memory_mb=int(data.get("memory_mb", 0)),
    )


def _state_and_start(pid: int, proc_root: Path) -> tuple[str, str] | None:
    """A process's state letter and start time (``/proc/PID/stat`` fields 3 and 22); None when gone."""
    try:
        stat = (proc_root / str(pid) / "stat").read_text(errors="replace")
    except OSError:
        return None
    fields = stat.rpartition(")")[2].split()
    return (fields[0], fields[19]) if len(fields) >= 20 else None


def process_start_time(pid: int, proc_root: Path = Path("/proc")) -> str | None:
    """The start time of a live process; None when gone or a zombie."""
    found = _state_and_start(pid, proc_root)
    return found[1] if found is not None and found[0] not in ("Z", "X") else None


def zombie_start_time(pid: int, proc_root: Path = Path("/proc")) -> str | None:
    """The start time of a process that has exited and waits to be reaped; None otherwise."""
    found = _state_and_start(pid, proc_root)
    return found[1] if found is not None and found[0] == "Z" else None


def process_command(pid: int, proc_root: Path = Path("/proc")) -> list[str] | None:
    try:
        raw = (proc_root / str(pid) / "cmdline").read_bytes()
    except OSError:
        return None
    return [part.decode(errors="replace") for part in raw.split(b"\0")[:-1]]


def runs_command(actual: list[str], command: list[str]) -> bool:
    """True when a process whose argv is ``actual`` was started as ``command``.

    A script is run by the interpreter its ``#!`` line names, which the
    kernel puts before it: ``vllm serve M`` (a Python console script) shows
    as ``python /…/bin/vllm serve M``, or with the line's one argument
    (``python -s /…/bin/vllm serve M``).
    """
    if not command:
        return False
    if actual == command:
        return True
    return any(actual[skip:] == command for skip in (1, 2)) and _is_script(command[0])


def _is_script(path: str) -> bool:
    try:
        with open(path, "rb") as file:
            return file.read(2) == b"#!"
    except OSError:
        return False


def is_engine(record: ShardRecord, proc_root: Path = Path("/proc")) -> bool:
    """True when the record's pid is still the process it started (alive, same start, same argv)."""
    if record.pid <= 0 or not record.start_time:
        return False
    if process_start_time(record.pid, proc_root) != record.start_time:
        return False
    actual = process_command(record.pid, proc_root)
    return actual is not None and runs_command(actual, record.command)
