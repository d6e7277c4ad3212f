"""The HTTP protocol bench: each protocol answers every request it is fed, the figures CPU per request."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import uvloop

_ROOT = Path(__file__).resolve().parents[2]
_PATH = _ROOT / "bench" / "gateway" / "protocol.py"
_SPEC = importlib.util.spec_from_file_location("bench_gateway_protocol", _PATH)
assert _SPEC is not None and _SPEC.loader is not None
protocol = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = protocol
_SPEC.loader.exec_module(protocol)


def test_each_protocol_answers_every_request_on_one_kept_alive_connection() -> None:
    for name, made in protocol.protocols().items():
        spent = uvloop.run(protocol.cpu_per_request(made, 300))  # asserts every answer was written
        assert 0 < spent < 100_000, (name, spent)


def test_a_run_ends_with_one_json_line_naming_the_ratio() -> None:
    ran = subprocess.run(
        [sys.executable, str(_PATH), "--requests", "200", "--rounds", "1"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    figures = json.loads(ran.stdout.strip().splitlines()[-1])
    assert set(figures) >= {"us_uvicorn", "us_llmgw", "ratio_llmgw_uvicorn"}
    assert figures["ratio_llmgw_uvicorn"] == round(figures["us_llmgw"] / figures["us_uvicorn"], 3)
