"""llama-server: command line, health, metrics and compute, checked against captured real output.

Fixtures under ``data/`` were captured from a real llama-server built from
llama.cpp's source (CPU start-up at ``--verbosity 4``, /metrics idle and with
requests in flight, the flag lines of ``--help``). ``llamacpp-startup-cuda.log``
is written line for line from llama.cpp's log format strings (llama.cpp,
llama-model.cpp, ggml-cuda.cu), as no GPU build runs here.
"""

from __future__ import annotations

import re
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from llmgw.engines import llamacpp
from llmgw.engines.llamacpp import Compute, EngineLoad, command_line, parse_compute, parse_metrics
from llmgw.errors import ConfigError, EngineUnhealthy

from .conftest import Serve

DATA = Path(__file__).parent / "data"


def _data(name: str) -> str:
    return (DATA / name).read_text()


def _argv(**overrides: object) -> list[str]:
    options: dict[str, object] = {
        "port": 9001, "key_file": Path("/s/r1/api-key"), "ctx_size": 4096, "parallel": 2,
    }  # fmt: skip
    options.update(overrides)
    return command_line(Path("/opt/llama-server"), Path("/w/model.gguf"), **options)  # type: ignore[arg-type]


def _value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_command_line_starts_the_binary_on_the_weights_with_the_replica_key_file() -> None:
    argv = _argv()
    assert argv[0] == "/opt/llama-server"
    assert _value(argv, "--model") == "/w/model.gguf"
    assert (_value(argv, "--host"), _value(argv, "--port")) == ("127.0.0.1", "9001")
    assert _value(argv, "--api-key-file") == "/s/r1/api-key"
    assert "--api-key" not in argv
    assert (_value(argv, "--ctx-size"), _value(argv, "--parallel")) == ("8192", "2")
    assert "--metrics" in argv and "--no-webui" in argv


def test_ctx_size_is_the_context_of_one_request_so_llama_cpp_gets_it_times_parallel() -> None:
    argv = _argv(ctx_size=2048, parallel=4)
    assert (_value(argv, "--ctx-size"), _value(argv, "--parallel")) == ("8192", "4")


def test_ctx_size_zero_stays_the_models_own_context() -> None:
    assert _value(_argv(ctx_size=0, parallel=4), "--ctx-size") == "0"


def test_command_line_sets_gpu_layers_only_when_given() -> None:
    assert "-ngl" not in _argv()
    assert _value(_argv(gpu_layers=99), "-ngl") == "99"


def test_command_line_puts_extra_args_last() -> None:
    assert _argv(args=["--flash-attn", "on"])[-2:] == ["--flash-attn", "on"]


def test_every_flag_command_line_uses_exists_in_the_real_binary() -> None:
    known = set(re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", _data("llamacpp-help-flags.txt")))
    used = {arg for arg in _argv(gpu_layers=10) if arg.startswith("-")}
    assert used <= known, used - known


@pytest.mark.parametrize("flag", ["--api-key", "--host=0.0.0.0", "--port", "-m", "--api-key-file"])
def test_command_line_refuses_extra_args_that_override_its_own_flags(flag: str) -> None:
    with pytest.raises(ConfigError, match="may not set"):
        _argv(args=[flag, "x"])


def test_command_line_refuses_an_empty_key_file() -> None:
    with pytest.raises(ConfigError, match="API key file"):
        _argv(key_file=Path())


def test_parse_metrics_reads_an_idle_server() -> None:
    assert parse_metrics(_data("llamacpp-metrics-idle.txt")) == EngineLoad(
        running=0, waiting=0, kv_cache_usage=None, prompt_tokens_total=32, generated_tokens_total=8
    )


def test_parse_metrics_reads_running_and_deferred_requests() -> None:
    load = parse_metrics(_data("llamacpp-metrics-busy.txt"))
    assert (load.running, load.waiting, load.prompt_tokens_total) == (2, 1, 76)


def test_parse_metrics_reads_the_kv_cache_ratio_of_older_releases() -> None:
    text = "llamacpp:kv_cache_usage_ratio 0.25\nllamacpp:requests_processing 1\n"
    assert parse_metrics(text).kv_cache_usage == 0.25


def test_parse_metrics_of_empty_text_is_an_idle_load() -> None:
    assert parse_metrics("") == EngineLoad(queue_reported=False)  # the router counts its own


def test_parse_compute_of_a_cpu_start_is_the_cpu() -> None:
    assert parse_compute(_data("llamacpp-startup-cpu.log")) == Compute(backend="cpu")


def test_parse_compute_of_a_cuda_start_names_devices_and_layers() -> None:
    compute = parse_compute(_data("llamacpp-startup-cuda.log"))
    assert compute == Compute(
        backend="cuda", devices=("CUDA0", "CUDA1"), layers_offloaded=31, layers_total=31
    )
    assert compute.all_on_gpu


def test_parse_compute_of_a_vulkan_start() -> None:
    log = (
        "llama_model_load_from_file_impl: using device Vulkan0 (NVIDIA GeForce RTX 4090) (unknown id)"
        " - 23000 MiB free\nload_tensors: offloaded 25/25 layers to GPU\n"
    )
    assert parse_compute(log) == Compute(
        backend="vulkan", devices=("Vulkan0",), layers_offloaded=25, layers_total=25
    )


def test_parse_compute_of_a_gpu_build_that_offloaded_nothing_is_the_cpu() -> None:
    log = "using device CUDA0 (NVIDIA A100) (0000:01:00.0) - 80000 MiB free\noffloaded 0/31 layers to GPU\n"
    compute = parse_compute(log)
    assert (compute.backend, compute.layers_offloaded, compute.all_on_gpu) == ("cpu", 0, False)


def test_parse_compute_of_a_partial_offload_is_not_all_on_gpu() -> None:
    compute = parse_compute("using device CUDA0 (X) (id) - 1 MiB free\noffloaded 12/31 layers to GPU\n")
    assert compute.backend == "cuda" and not compute.all_on_gpu


def _health_app(statuses: list[int]) -> web.Application:
    async def health(request: web.Request) -> web.Response:
        return web.json_response({}, status=statuses.pop(0) if len(statuses) > 1 else statuses[0])

    app = web.Application()
    app.router.add_get("/health", health)
    return app


async def test_health_is_false_while_loading_and_true_once_ready(
    serve: Serve, session: aiohttp.ClientSession
) -> None:
    base = await serve(_health_app([503, 200]))
    assert [await llamacpp.health(session, base, "k") for _ in range(2)] == [False, True]


async def test_health_is_false_when_nothing_listens(session: aiohttp.ClientSession) -> None:
    assert await llamacpp.health(session, "http://127.0.0.1:9", "k", timeout=2) is False


async def test_read_load_sends_the_key_and_parses(serve: Serve, session: aiohttp.ClientSession) -> None:
    async def metrics(request: web.Request) -> web.Response:
        if request.headers.get("Authorization") != "Bearer k":
            return web.json_response({}, status=401)
        return web.Response(text=_data("llamacpp-metrics-busy.txt"))

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    base = await serve(app)
    assert (await llamacpp.read_load(session, base, "k")).running == 2
    with pytest.raises(EngineUnhealthy, match="401"):
        await llamacpp.read_load(session, base, "wrong")


async def test_read_load_of_metrics_with_bytes_outside_utf8_still_reads(
    serve: Serve, session: aiohttp.ClientSession
) -> None:
    async def metrics(request: web.Request) -> web.Response:
        body = b'llamacpp:requests_processing{slot="\xff\xfe"} 2\nllamacpp:requests_deferred 1\n'
        return web.Response(body=body, content_type="text/plain", charset="utf-8")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    base = await serve(app)
    load = await llamacpp.read_load(session, base, "k")
    assert (load.running, load.waiting) == (2, 1)


def test_parse_metrics_refuses_an_infinite_count() -> None:
    with pytest.raises(EngineUnhealthy, match="llamacpp:requests_processing"):
        parse_metrics("llamacpp:requests_processing +Inf\n")
