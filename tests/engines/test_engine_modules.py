"""vLLM, SGLang and TensorRT-LLM: command lines from profiles, and their metrics read as one load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from llmgw.core.engines import LLAMA_CPP, SGLANG
from llmgw.core.shards import Rendezvous
from llmgw.engines import llamacpp, ray_launcher, sglang, trtllm, vllm
from llmgw.engines.engine import Engine, Launch, parse_load
from llmgw.engines.registry import engine_named
from llmgw.errors import ConfigError, EngineUnhealthy

WEIGHTS = Path("/work/weights/abc")


KEY_FILE = Path("/work/shards/r1/api-key")


def launch(**changes: object) -> Launch:
    base: dict[str, object] = {
        "weights": WEIGHTS, "port": 21001, "api_key": "sk-replica", "model": "qwen", "key_file": KEY_FILE,
    }  # fmt: skip
    return Launch(**(base | changes))  # type: ignore[arg-type]


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_vllm_serves_the_folder_under_the_catalog_name_with_the_replica_key_in_its_environment() -> None:
    spec = launch(tp=2, ctx_size=8192, parallel=16)
    argv = vllm.ENGINE.command_line(Path("/v/bin/vllm"), spec)
    assert argv[:3] == ["/v/bin/vllm", "serve", str(WEIGHTS)]
    assert "sk-replica" not in " ".join(argv) and "--api-key" not in argv
    assert vllm.ENGINE.environment(spec) == {"VLLM_API_KEY": "sk-replica"}
    assert flag(argv, "--served-model-name") == "qwen"
    assert flag(argv, "--tensor-parallel-size") == "2"
    assert flag(argv, "--max-model-len") == "8192"
    assert flag(argv, "--max-num-seqs") == "16"
    assert flag(argv, "--host") == "127.0.0.1"
    assert "--enable-lora" not in argv and "--kv-events-config" not in argv


def test_vllms_cpu_build_runs_its_openai_server_from_its_python_with_host_memory_defaults() -> None:
    spec = launch(kv_events_port=21500)
    argv = vllm.ENGINE.command_line(Path("/v/bin/python"), spec)
    assert argv[:5] == ["/v/bin/python", "-m", "vllm.entrypoints.openai.api_server", "--model", str(WEIGHTS)]
    assert flag(argv, "--served-model-name") == "qwen" and "--kv-events-config" in argv
    assert vllm.ENGINE.default_environment(spec) == {
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    }
    assert vllm.ENGINE.default_environment(launch(devices=(0,))) == {}  # on a card: nothing of the CPU's


def test_vllm_runtime_lora_turns_on_slots_and_the_runtime_routes() -> None:
    spec = launch(max_loaded_adapters=3)
    argv = vllm.ENGINE.command_line(Path("vllm"), spec)
    assert "--enable-lora" in argv and flag(argv, "--max-loras") == "3"
    assert vllm.ENGINE.environment(spec)["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"


def test_vllm_kv_events_publish_on_a_loopback_port_with_replay_and_stable_hashes() -> None:
    spec = launch(kv_events_port=21500, kv_replay_port=21501)
    argv = vllm.ENGINE.command_line(Path("vllm"), spec)
    config = json.loads(flag(argv, "--kv-events-config"))
    assert config == {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": "tcp://127.0.0.1:21500",
        "topic": "kv-events",
        "replay_endpoint": "tcp://127.0.0.1:21501",
        "buffer_steps": 10_000,
    }
    assert flag(argv, "--prefix-caching-hash-algo") == "sha256_cbor"
    assert vllm.ENGINE.environment(spec)["PYTHONHASHSEED"] == "0"
    assert vllm.kv_events_ports(argv) == (21500, 21501)  # what an adopting agent reads back
    without_replay = vllm.ENGINE.command_line(Path("vllm"), launch(kv_events_port=21500))
    assert "replay_endpoint" not in json.loads(flag(without_replay, "--kv-events-config"))
    assert vllm.kv_events_ports(without_replay) == (21500, None)
    assert vllm.kv_events_ports(vllm.ENGINE.command_line(Path("vllm"), launch())) == (None, None)
    assert vllm.kv_events_ports(["vllm", "serve", "--kv-events-config", "{not json"]) == (None, None)


def test_sglang_gets_tp_size_and_metrics_turned_on() -> None:
    argv = sglang.ENGINE.command_line(
        Path("/s/bin/python"), launch(tp=4, args=("--mem-fraction-static", "0.8"))
    )
    assert argv[:3] == ["/s/bin/python", "-m", "sglang.launch_server"]
    assert flag(argv, "--model-path") == str(WEIGHTS)
    assert flag(argv, "--tp-size") == "4" and "--tp" not in argv
    assert "--enable-metrics" in argv
    assert flag(argv, "--config") == str(KEY_FILE)
    assert "sk-replica" not in " ".join(argv) and "--api-key" not in argv
    assert argv[-2:] == ["--mem-fraction-static", "0.8"]


def test_llamacpp_reads_its_key_from_the_file_the_agent_wrote() -> None:
    argv = llamacpp.ENGINE.command_line(Path("llama-server"), launch())
    assert flag(argv, "--api-key-file") == str(KEY_FILE)
    assert "sk-replica" not in " ".join(argv) and "--api-key" not in argv


@pytest.mark.parametrize("name", ["sglang", "llama.cpp"])
def test_an_engine_reading_its_key_from_a_file_refuses_to_start_without_one(name: str) -> None:
    with pytest.raises(ConfigError, match="reads its key from a file"):
        engine_named(name).command_line(Path("x"), launch(key_file=None))


def test_key_files_hold_the_key_as_each_engine_reads_it() -> None:
    assert LLAMA_CPP.key_input.file_text("k-1") == "k-1\n"  # llama.cpp: one key a line
    assert yaml.safe_load(SGLANG.key_input.file_text("k-1")) == {"api-key": "k-1"}  # SGLang's --config
    assert SGLANG.key_input.filename.endswith(".yaml")  # SGLang refuses any other suffix
    with pytest.raises(ValueError, match="one line"):
        LLAMA_CPP.key_input.file_text("k\n#")


def test_the_key_never_shows_in_a_launch_printed_for_a_log() -> None:
    assert "sk-replica" not in repr(launch())


def test_trtllm_runs_behind_the_launcher_with_the_key_in_its_environment_only() -> None:
    spec = launch(tp=2)
    argv = trtllm.ENGINE.command_line(Path("/opt/trt/bin/python"), spec)
    assert argv[1:3] == ["-m", "llmgw.engines.trtllm_launcher"]
    assert flag(argv, "--trtllm-serve") == "/opt/trt/bin/trtllm-serve"
    serve = argv[argv.index("--") + 1 :]
    assert serve[:2] == ["serve", str(WEIGHTS)]
    assert flag(serve, "--tp_size") == "2"
    assert "sk-replica" not in argv
    assert trtllm.ENGINE.environment(spec) == {"LLMGW_REPLICA_KEY": "sk-replica"}


@pytest.mark.parametrize("name", ["vllm", "sglang", "trtllm", "llama.cpp"])
def test_every_engine_demands_a_key(name: str) -> None:
    with pytest.raises(ConfigError, match="API key"):
        engine_named(name).command_line(Path("x"), launch(api_key=""))


def test_llamacpp_loads_the_projector() -> None:
    argv = llamacpp.ENGINE.command_line(Path("llama-server"), launch(projector=Path("/w/mmproj.gguf")))
    assert flag(argv, "--mmproj") == "/w/mmproj.gguf"


def test_unknown_engine_is_named() -> None:
    with pytest.raises(ConfigError, match="unknown engine 'tgi'"):
        engine_named("tgi")


VLLM_TEXT = """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="qwen"} 3.0
vllm:num_requests_waiting{engine="0",model_name="qwen"} 2.0
vllm:kv_cache_usage_perc{engine="0",model_name="qwen"} 0.42
vllm:prompt_tokens_total{engine="0",model_name="qwen"} 1200.0
vllm:generation_tokens_total{engine="0",model_name="qwen"} 340.0
"""
VLLM_OLD = 'vllm:num_requests_running 1\nvllm:num_requests_waiting 0\nvllm:gpu_cache_usage_perc{x="1"} 0.25\n'
SGLANG_TEXT = """sglang:num_running_reqs{model_name="qwen",tp_rank="0"} 5.0
sglang:num_queue_reqs{model_name="qwen",tp_rank="0"} 7.0
sglang:token_usage{model_name="qwen",tp_rank="0"} 0.6
sglang:prompt_tokens_total{model_name="qwen"} 9.0
sglang:generation_tokens_total{model_name="qwen"} 4.0
"""
TRTLLM_TEXT = """trtllm_num_requests_running{model_name="qwen",engine_type="trtllm"} 2.0
trtllm_num_requests_waiting{model_name="qwen",engine_type="trtllm"} 1.0
trtllm_kv_cache_utilization{model_name="qwen",engine_type="trtllm"} 0.1
trtllm_prompt_tokens_total{model_name="qwen",engine_type="trtllm"} 50.0
trtllm_generation_tokens_total{model_name="qwen",engine_type="trtllm"} 20.0
"""


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("vllm", VLLM_TEXT, (3, 2, 0.42, 1200, 340)),
        ("vllm", VLLM_OLD, (1, 0, 0.25, 0, 0)),
        ("sglang", SGLANG_TEXT, (5, 7, 0.6, 9, 4)),
        ("trtllm", TRTLLM_TEXT, (2, 1, 0.1, 50, 20)),
    ],
)
def test_each_engines_names_map_onto_one_load(name: str, text: str, expected: tuple[object, ...]) -> None:
    engine = engine_named(name)
    load = parse_load(text, engine.metrics, name)
    got = (
        load.running,
        load.waiting,
        load.kv_cache_usage,
        load.prompt_tokens_total,
        load.generated_tokens_total,
    )
    assert got == expected


def test_metrics_of_another_engine_read_as_unreadable() -> None:
    with pytest.raises(EngineUnhealthy, match="sglang:num_running_reqs"):
        parse_load(VLLM_TEXT, sglang.ENGINE.metrics, "sglang")


def test_the_trtllm_launcher_refuses_to_start_without_the_replica_key() -> None:
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "LLMGW_REPLICA_KEY"}
    done = subprocess.run(
        [sys.executable, "-m", "llmgw.engines.trtllm_launcher", "--trtllm-serve", "/nowhere", "--port", "1",
         "--", "serve", "m"],
        env=env, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    assert done.returncode == 2
    assert "no replica key in LLMGW_REPLICA_KEY" in done.stderr


@pytest.mark.parametrize(
    ("engine", "program", "context_flag", "expected"),
    [
        (llamacpp.ENGINE, "llama-server", "--ctx-size", "8192"),  # all 4 slots together
        (vllm.ENGINE, "vllm", "--max-model-len", "2048"),
        (sglang.ENGINE, "python", "--context-length", "2048"),
        (trtllm.ENGINE, "/opt/trt/bin/python", "--max_seq_len", "2048"),
    ],
)
def test_ctx_size_is_the_context_of_one_request_on_every_engine(
    engine: Engine, program: str, context_flag: str, expected: str
) -> None:
    argv = engine.command_line(Path(program), launch(ctx_size=2048, parallel=4))
    assert flag(argv, context_flag) == expected


def test_each_engine_is_given_the_pipeline_parallel_degree_by_its_own_flag() -> None:
    spec = launch(tp=2, pp=3)
    argv = vllm.ENGINE.command_line(Path("vllm"), spec)
    assert (flag(argv, "--tensor-parallel-size"), flag(argv, "--pipeline-parallel-size")) == ("2", "3")
    argv = sglang.ENGINE.command_line(Path("python"), spec)
    assert (flag(argv, "--tp-size"), flag(argv, "--pp-size")) == ("2", "3")
    argv = trtllm.ENGINE.command_line(Path("/opt/trt/bin/python"), spec)
    serve = argv[argv.index("--") + 1 :]
    assert (flag(serve, "--tp_size"), flag(serve, "--pp_size")) == ("2", "3")


def test_a_multi_node_vllm_head_starts_the_ray_head_then_vllm_over_ray() -> None:
    spec = launch(tp=2, pp=2, rendezvous=Rendezvous(rank=0, nodes=2, address="10.0.0.1:24100"))
    argv = vllm.ENGINE.command_line(Path("/v/bin/vllm"), spec)
    assert argv[1:3] == ["-m", "llmgw.engines.ray_launcher"]
    assert (flag(argv, "--ray"), flag(argv, "--address")) == ("/v/bin/ray", "10.0.0.1:24100")
    assert "--head" in argv[: argv.index("--")]
    serve = argv[argv.index("--") + 1 :]
    assert serve[:3] == ["/v/bin/vllm", "serve", str(WEIGHTS)]
    assert flag(serve, "--distributed-executor-backend") == "ray"
    assert (flag(serve, "--tensor-parallel-size"), flag(serve, "--pipeline-parallel-size")) == ("2", "2")
    assert ray_launcher.head_command("/v/bin/ray", "10.0.0.1:24100", cards=2) == [
        "/v/bin/ray", "start", "--head", "--port", "24100", "--node-ip-address", "10.0.0.1",
        "--disable-usage-stats", "--num-gpus", "2", "--include-dashboard", "false", "--block",
    ]  # fmt: skip


def test_a_multi_node_vllm_worker_only_joins_the_head_and_answers_health_on_its_port() -> None:
    spec = launch(tp=2, pp=2, rendezvous=Rendezvous(rank=1, nodes=2, address="10.0.0.1:24100"))
    argv = vllm.ENGINE.command_line(Path("/v/bin/vllm"), spec)
    assert argv[1:3] == ["-m", "llmgw.engines.ray_launcher"]
    assert "--head" not in argv and "serve" not in argv
    assert (flag(argv, "--address"), flag(argv, "--port")) == ("10.0.0.1:24100", "21001")
    assert ray_launcher.worker_command("/v/bin/ray", "10.0.0.1:24100", "10.0.0.2", cards=2) == [
        "/v/bin/ray", "start", "--address", "10.0.0.1:24100", "--node-ip-address", "10.0.0.2",
        "--disable-usage-stats", "--num-gpus", "2", "--block",
    ]  # fmt: skip


def test_a_shard_whose_build_has_no_ray_says_so_and_what_to_install(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = str(tmp_path / "venv" / "bin" / "ray")
    argv = ["--ray", missing, "--address", "10.0.0.1:24100", "--port", "21001"]
    assert ray_launcher.main(argv) == ray_launcher.NO_RAY_EXIT
    said = capsys.readouterr().err
    assert f"no ray program at {missing}" in said and "pip install ray" in said


def test_ray_is_given_the_cards_the_agent_gave_the_shard_and_none_on_a_node_without_cards() -> None:
    assert ray_launcher.cards_given({"CUDA_VISIBLE_DEVICES": "2,3"}) == 2
    assert ray_launcher.cards_given({"CUDA_VISIBLE_DEVICES": ""}) is None
    assert ray_launcher.cards_given({}) is None
    assert "--num-gpus" not in ray_launcher.worker_command("ray", "10.0.0.1:24100", "10.0.0.2", cards=None)


@pytest.mark.parametrize("rank", [0, 1])
def test_every_sglang_shard_gets_the_node_count_its_rank_and_the_heads_address(rank: int) -> None:
    spec = launch(tp=4, rendezvous=Rendezvous(rank=rank, nodes=2, address="10.0.0.1:24100"))
    argv = sglang.ENGINE.command_line(Path("python"), spec)
    assert flag(argv, "--nnodes") == "2" and flag(argv, "--node-rank") == str(rank)
    assert flag(argv, "--dist-init-addr") == "10.0.0.1:24100"
    assert flag(argv, "--port") == "21001"  # rank 0 serves there; the others answer /health there


def test_one_node_command_lines_carry_no_rendezvous() -> None:
    assert "--nnodes" not in sglang.ENGINE.command_line(Path("python"), launch())
    assert "--distributed-executor-backend" not in vllm.ENGINE.command_line(Path("vllm"), launch())


def test_trtllm_refuses_a_multi_node_shard_saying_what_to_do() -> None:
    spec = launch(rendezvous=Rendezvous(rank=0, nodes=2, address="10.0.0.1:24100"))
    with pytest.raises(ConfigError, match="several nodes") as raised:
        trtllm.ENGINE.command_line(Path("python"), spec)
    assert "nodes 1" in (raised.value.hint or "")
