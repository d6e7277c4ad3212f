"""The gateway benchmark's cheap load and engine: wrk's Lua script and the static nginx engine answer as
llama-server does on the paths the agent and the gateway use."""

from __future__ import annotations

import importlib.util
import json
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from llmgw.testing.cluster import free_port, wait_for
from llmgw.testing.llama_server_standin import WHOLE

_PATH = Path(__file__).resolve().parents[2] / "bench" / "gateway" / "cheapload.py"
_SPEC = importlib.util.spec_from_file_location("bench_gateway_cheapload", _PATH)
assert _SPEC is not None and _SPEC.loader is not None
cheapload = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = cheapload
_SPEC.loader.exec_module(cheapload)


def test_a_body_goes_into_lua_as_a_long_string_whatever_brackets_it_holds() -> None:
    assert cheapload.lua_string('{"a": "]]"}') == '[=[{"a": "]]"}]=]'
    assert cheapload.lua_string("plain") == "[[plain]]"


def test_the_static_engine_takes_llama_servers_flags_and_answers_its_paths(tmp_path: Path) -> None:
    nginx = cheapload.nginx_binary()
    if nginx is None:
        pytest.fail("nginx is not installed: run 'make wrk' (apt-get install wrk nginx-light)")
    launcher = cheapload.write_nginx_launcher(tmp_path / "llama-server", sys.executable, nginx)
    port = free_port()
    process = subprocess.Popen(
        [str(launcher), "--model", "m.gguf", "--host", "127.0.0.1", "--port", str(port), "--metrics"],
        stderr=subprocess.PIPE,
    )
    try:

        def up() -> bool:
            with socket.socket() as probe:
                return probe.connect_ex(("127.0.0.1", port)) == 0

        wait_for(up, 10, "nginx listens")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5) as answer:
            assert json.load(answer) == {"status": "ok"}
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
            assert "llamacpp:requests_processing 0" in answer.read().decode()
        chat = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/chat/completions", data=b'{"model": "m"}', method="POST"
        )
        with urllib.request.urlopen(chat, timeout=5) as answer:
            assert answer.read() == WHOLE
    finally:
        process.terminate()
        process.wait(10)
    # its run directory lies beside the launcher (the benchmark's temporary home), one per port
    assert [p.name for p in tmp_path.iterdir() if p.is_dir()] == [f"llmgw-nginx-{port}"]
    assert (tmp_path / f"llmgw-nginx-{port}" / "nginx.conf").exists()
