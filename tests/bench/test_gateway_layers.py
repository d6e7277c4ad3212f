"""The gateway bench's profile reading: py-spy's collapsed stacks into CPU per request by layer."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

_ROOT = Path(__file__).resolve().parents[2]
_PATH = _ROOT / "bench" / "gateway" / "layers.py"
_SPEC = importlib.util.spec_from_file_location("bench_gateway_layers", _PATH)
assert _SPEC is not None and _SPEC.loader is not None
layers = importlib.util.module_from_spec(_SPEC)
sys.modules[_SPEC.name] = layers
_SPEC.loader.exec_module(layers)

RECORDING = Path(__file__).parent / "data" / "gateway-c64.collapsed"
"""py-spy 0.4.3 ``record --format raw --rate 250`` of llmgw's server at c=64 (``make bench-gateway``)."""

ROOT = (
    "_run_module_as_main (<frozen runpy>:198);run (uvloop/__init__.py:92);Runner.run (asyncio/runners.py:118)"
)


def test_a_sample_is_counted_in_the_layer_of_the_frame_nearest_its_leaf() -> None:
    stack = (
        f"{ROOT};RequestResponseCycle.run_asgi (uvicorn/protocols/http/httptools_impl.py:420);"
        "Gateway.__call__ (llmgw/gateway/app.py:279);parse (llmgw/gateway/bodies.py:40)"
    )
    assert layers.attribute(stack) == "body parse and checks"
    assert layers.attribute(stack.rsplit(";", 1)[0]) == "gateway dispatch and answers"


def test_the_standard_library_below_a_layer_is_that_layers_cost() -> None:
    stack = (
        f"{ROOT};parse (llmgw/gateway/bodies.py:40);loads (json/__init__.py:346);decode (json/decoder.py:337)"
    )
    assert layers.attribute(stack) == "body parse and checks"


def test_a_stack_of_only_the_loop_and_the_standard_library_is_the_event_loops() -> None:
    assert layers.attribute(ROOT) == layers.EVENT_LOOP
    assert layers.attribute("_bootstrap (threading.py:1012);run (threading.py:990)") == layers.EVENT_LOOP
    assert layers.attribute(f"{ROOT};dumps (somelib/encoder.py:10)") == layers.OTHER_LIBRARIES


def test_the_asgi_layers_in_front_of_the_gateway_are_one_layer() -> None:
    in_front = ("uvicorn/middleware/proxy_headers.py", "llmgw/controlplane/admin/admission.py",
                "llmgw/controlplane/serving/relaying.py",
                "llmgw/controlplane/serving/httpserving.py")  # fmt: skip
    for file in in_front:
        assert layers.attribute(f"{ROOT};f ({file}:1)").startswith("ASGI layers before the gateway")


def test_a_claim_may_name_a_function_within_a_file() -> None:
    protocol = "GuardedHttpProtocol.data_received (llmgw/controlplane/serving/httpserving.py:299)"
    assert layers.attribute(f"{ROOT};{protocol}").startswith("HTTP server")
    routing = "route_by_prefix.<locals>.app (llmgw/controlplane/serving/httpserving.py:91)"
    assert layers.attribute(f"{ROOT};{routing}").startswith("ASGI layers before the gateway")


def test_a_sample_without_a_frame_is_counted_apart() -> None:
    assert layers.read([" 92", "f (llmgw/gateway/app.py:1) 8"]) == {
        layers.NO_FRAME: 92,
        "gateway dispatch and answers": 8,
    }


def test_frame_files_and_the_standard_library() -> None:
    assert layers.frame_file("Gateway.__call__ (llmgw/gateway/app.py:279)") == "llmgw/gateway/app.py"
    assert layers.frame_file("<module> (<frozen runpy>)") == "<frozen runpy>"
    assert layers.frame_file("not a frame") == ""
    assert layers.is_stdlib("asyncio/runners.py") and layers.is_stdlib("threading.py")
    assert not layers.is_stdlib("typer/core.py") and not layers.is_stdlib("uvloop/__init__.py")


def test_cpu_per_request_is_the_share_of_the_cores_over_the_rate() -> None:
    counts = {"a": 75, "b": 25}
    rows = layers.layers(counts, rps=1000.0, cores=0.5)
    assert [row.name for row in rows] == ["a", "b"]
    assert rows[0].share == pytest.approx(0.75)
    assert rows[0].us_per_request == pytest.approx(375.0)  # 0.75 of 0.5 cores / 1000 req/s
    assert rows[1].us_per_request == pytest.approx(125.0)
    assert all(row.us_per_request is None for row in layers.layers(counts))
    assert layers.layers({}) == []
    assert layers.figures(rows) == {"a": {"share": 0.75, "us": 375.0}, "b": {"share": 0.25, "us": 125.0}}


def test_a_recorded_profile_reads_into_every_sample_and_the_gateways_layers() -> None:
    lines = RECORDING.read_text(encoding="utf-8").splitlines()
    total = sum(int(line.rpartition(" ")[2]) for line in lines if line.rpartition(" ")[2].isdigit())
    counts = layers.read([*lines, "garbage without a count", ""])
    assert sum(counts.values()) == total > 100
    assert set(counts) <= {name for name, _ in layers.LAYERS} | {layers.OTHER_LIBRARIES, layers.NO_FRAME}
    for layer in ("HTTP server: parsing, writing (uvicorn, httptools)", "forwarding and relay",
                  "upstream client (connections, request, response read)", layers.EVENT_LOOP):  # fmt: skip
        assert counts.get(layer, 0) > 0, layer
    assert "other libraries" not in counts or counts["other libraries"] < total * 0.05


def test_the_command_prints_a_table_or_json(tmp_path: Path) -> None:
    run = [sys.executable, str(_PATH), str(RECORDING), "--rps", "2000", "--cores", "0.9"]
    text = subprocess.run(run, capture_output=True, text=True, check=True).stdout
    assert text.splitlines()[0].split()[0] == "layer" and "total (" in text.splitlines()[-1]
    shown = json.loads(subprocess.run([*run, "--json"], capture_output=True, text=True, check=True).stdout)
    assert sum(layer["us"] for layer in shown.values()) == pytest.approx(
        450.0, abs=1.0
    )  # 0.9 cores / 2000 req/s
