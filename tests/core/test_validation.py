"""C4.5: what a profile's args and env may hold, per engine, and how each refusal reads."""

from __future__ import annotations

import pytest

from llmgw.core.catalog import parse_model
from llmgw.core.validation import check_args, check_env
from llmgw.errors import ValidationFailed

SHA = "a" * 64


def model(engine: str = "vllm", **profile: object) -> dict[str, object]:
    fmt = "gguf" if engine == "llama.cpp" else "safetensors"
    return {"name": "m", "source": {"sha256": SHA, "format": fmt}, "profile": {"engine": engine, **profile}}


@pytest.mark.parametrize(
    ("engine", "flag", "why"),
    [
        ("vllm", "--trust-remote-code", "runs code"),
        ("llama.cpp", "--log-file", "writes a file"),
        ("llama.cpp", "--slot-save-path", "writes files"),
        ("vllm", "--tool-parser-plugin", "loads code"),
        ("vllm", "--middleware", "loads code"),
        ("vllm", "--allowed-local-media-path", "read local files"),
        ("vllm", "--api-key", "llmgw sets it itself"),
        ("sglang", "--enable-metrics", "llmgw sets it itself"),
        ("trtllm", "--extra_llm_api_options", "llmgw sets it itself"),
        ("llama.cpp", "--mmproj", "llmgw sets it itself"),
    ],
)
def test_refused_flags_name_the_flag_and_why(engine: str, flag: str, why: str) -> None:
    refusals = check_args(engine, [flag, "x"])
    assert len(refusals) == 1
    assert refusals[0].what.replace("_", "-") == flag.replace("_", "-")
    assert why in refusals[0].why


def test_flags_with_values_after_equals_and_underscores_are_caught() -> None:
    assert [r.what for r in check_args("vllm", ["--trust_remote_code", "--log-file=/tmp/x"])] == [
        "--trust-remote-code",
        "--log-file",
    ]


def test_argparse_abbreviation_of_a_refused_flag_is_refused() -> None:
    refusals = check_args("vllm", ["--trust-remote"])
    assert refusals and "--trust-remote-code" in refusals[0].why
    assert check_args("trtllm", ["--trust-remote"]) == []  # click takes no abbreviations


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_an_engines_own_flag_is_not_taken_for_an_abbreviation_of_a_longer_one(engine: str) -> None:
    """argparse takes an exact flag before prefixes: --chat-template is the engine's own, which reads
    a file, not an abbreviation of --chat-template-file."""
    (refusal,) = check_args(engine, ["--chat-template", "/etc/passwd"])
    assert refusal.what == "--chat-template"
    assert "chat_template.jinja" in refusal.why and "reads it as" not in refusal.why
    (shorter,) = check_args(engine, ["--chat-templ=x"])
    assert "reads it as --chat-template," in shorter.why
    assert check_args("llama.cpp", ["--chat-template", "chatml"]) == []  # a built-in template's name


def test_tuning_flags_and_values_pass() -> None:
    assert check_args("vllm", ["--dtype", "half", "--gpu-memory-utilization", "0.85", "-5"]) == []


TP = "llmgw sets it from the profile's tp; set profile.tp"
PP = "llmgw sets it from the profile's pp; set profile.pp"
DP = "set replicas.min and replicas.max"
PREFIX_CACHE = "llmgw keeps the engine's prefix cache on"
KV_EVENTS = "set profile.kv_events"
BLOCK_SIZE = "llmgw reads the block size the engine uses from its KV events; remove it"


@pytest.mark.parametrize(
    ("engine", "token", "why"),
    [
        ("vllm", "--tensor-parallel-size", TP),
        ("vllm", "-tp", TP),
        ("vllm", "--tensor_parallel_size=2", TP),
        ("vllm", "-tp=2", TP),
        ("vllm", "--pipeline-parallel-size", PP),
        ("vllm", "-pp", PP),
        ("vllm", "--data-parallel-size", DP),
        ("vllm", "-dp", DP),
        ("vllm", "--data-parallel-size-local", DP),
        ("vllm", "-dpl", DP),
        ("vllm", "--enable-prefix-caching", PREFIX_CACHE),
        ("vllm", "--no-enable-prefix-caching", PREFIX_CACHE),
        ("vllm", "--prefix-caching-hash-algo", KV_EVENTS),
        ("vllm", "--kv-events-config", KV_EVENTS),
        ("vllm", "--block-size", BLOCK_SIZE),
        ("vllm", "--block_size=32", BLOCK_SIZE),
        ("sglang", "--tp-size", TP),
        ("sglang", "--tensor-parallel-size", TP),
        ("sglang", "--tp", TP),
        ("sglang", "--pp-size", PP),
        ("sglang", "--pipeline-parallel-size", PP),
        ("sglang", "--dp-size", DP),
        ("sglang", "--data-parallel-size", DP),
        ("sglang", "--dp", DP),
        ("sglang", "--disable-radix-cache", PREFIX_CACHE),
        (
            "sglang",
            "--kv-events-config",
            "llmgw takes KV events from vllm only (profile.kv_events); remove it",
        ),
        ("sglang", "--page-size", BLOCK_SIZE),
        ("trtllm", "--tp_size", TP),
        ("trtllm", "--tensor_parallel_size", TP),
        ("trtllm", "--pp_size", PP),
        ("trtllm", "--pipeline_parallel_size", PP),
        ("llama.cpp", "--cache-prompt", PREFIX_CACHE),
        ("llama.cpp", "--no-cache-prompt", PREFIX_CACHE),
    ],
)
def test_flags_of_what_llmgw_manages_are_refused_saying_what_to_set(
    engine: str, token: str, why: str
) -> None:
    (refusal,) = check_args(engine, [token, "2"])
    assert refusal.what == token.split("=")[0].replace("_", "-")
    assert why in refusal.why


@pytest.mark.parametrize(
    ("engine", "token", "expanded"),
    [
        ("vllm", "-t", "-tp"),
        ("vllm", "-p", "-pp"),
        ("vllm", "--tensor", "--tensor-parallel-size"),
        ("vllm", "--no-enable-prefix", "--no-enable-prefix-caching"),
        ("vllm", "--block", "--block-size"),
        ("sglang", "--disable-radix", "--disable-radix-cache"),
        ("sglang", "--page", "--page-size"),
    ],
)
def test_argparse_abbreviations_of_managed_flags_are_refused_saying_what_to_set(
    engine: str, token: str, expanded: str
) -> None:
    (refusal,) = check_args(engine, [token, "2"])
    assert refusal.why.startswith(f"the engine reads it as {expanded}, which is refused: llmgw ")
    assert refusal.why.endswith(("; set profile.tp", "; set profile.pp", "; remove it", "are routed)"))


TUNING = {
    "vllm": "--gpu-memory-utilization 0.9 --max-num-batched-tokens 8192 --enable-chunked-prefill "
    "--kv-cache-dtype fp8 --swap-space 4 -O3 -q awq --enforce-eager --num-gpu-blocks-override 2048 "
    "--enable-expert-parallel",
    "sglang": "--mem-fraction-static 0.8 --chunked-prefill-size 4096 --attention-backend flashinfer "
    "--schedule-policy lpm --max-total-tokens 65536",
    "trtllm": "--kv_cache_free_gpu_memory_fraction 0.8 --max_num_tokens 8192 --ep_size 2 "
    "--enable_chunked_prefill",
    "llama.cpp": "--cache-reuse 256 --cache-ram 4096 -t 8 -fa on -ctk q8_0",
}
"""Tuning flags of each engine, beside the managed ones they resemble (llama.cpp's ``-t`` is its threads)."""


@pytest.mark.parametrize(("engine", "args"), TUNING.items())
def test_ordinary_tuning_flags_still_pass(engine: str, args: str) -> None:
    assert check_args(engine, args.split()) == []


def test_a_variable_setting_a_managed_flag_is_refused_as_that_flag() -> None:
    (refusal,) = check_env("llama.cpp", {"LLAMA_ARG_CACHE_PROMPT": "0"})
    assert refusal.what == "LLAMA_ARG_CACHE_PROMPT"
    assert refusal.why.startswith("sets --cache-prompt, llmgw keeps the engine's prefix cache on")


def test_the_catalog_refuses_a_managed_flag_in_args_naming_the_field_to_set() -> None:
    with pytest.raises(ValidationFailed) as caught:
        parse_model(model(args=["-tp", "2", "--data-parallel-size", "2"]))
    why = dict(caught.value.problems)["profile.args"]  # type: ignore[attr-defined]
    assert "-tp: llmgw sets it from the profile's tp; set profile.tp" in why
    assert "--data-parallel-size: llmgw runs data parallelism as replicas" in why


@pytest.mark.parametrize(
    "name",
    ["NCCL_NET_PLUGIN", "CUDA_INJECTION64_PATH", "VLLM_HOST_IP", "VLLM_RPC_BASE_PATH", "VLLM_S3_SECRET"],
)
def test_env_names_of_paths_plugins_addresses_and_credentials_are_refused(name: str) -> None:
    refusals = check_env("vllm", {name: "x"})
    assert [r.what for r in refusals] == [name]
    assert "path, plugin, library, address or credential" in refusals[0].why


@pytest.mark.parametrize(("engine", "name"), [("vllm", "VLLM_API_KEY"), ("trtllm", "LLMGW_REPLICA_KEY")])
def test_the_variable_carrying_the_replica_key_is_the_agents_own(engine: str, name: str) -> None:
    refusals = check_env(engine, {name: "x"})
    assert [(r.what, r.why) for r in refusals] == [(name, "llmgw sets it itself; remove it from env")]


@pytest.mark.parametrize(("engine", "flag"), [("llama.cpp", "--api-key-file"), ("sglang", "--config")])
def test_the_flag_naming_the_key_file_is_the_agents_own(engine: str, flag: str) -> None:
    refusals = check_args(engine, [flag, "/tmp/k"])
    assert [(r.what, r.why) for r in refusals] == [(flag, "llmgw sets it itself; remove it from args")]


def test_env_outside_the_tuning_families_is_refused() -> None:
    refusals = check_env("vllm", {"LD_PRELOAD": "/x.so", "HF_TOKEN": "t"})
    assert {r.what for r in refusals} == {"LD_PRELOAD", "HF_TOKEN"}
    assert all("not a tuning variable" in r.why for r in refusals)


def test_tuning_env_passes() -> None:
    assert (
        check_env("vllm", {"NCCL_DEBUG": "INFO", "VLLM_LOGGING_LEVEL": "DEBUG", "OMP_NUM_THREADS": "4"}) == []
    )


def test_llama_arg_variables_are_checked_as_the_flags_they_set() -> None:
    refusals = check_env("llama.cpp", {"LLAMA_ARG_SLOT_SAVE_PATH": "/tmp", "LLAMA_ARG_API_KEY": "k"})
    whys = {r.what: r.why for r in refusals}
    assert "--slot-save-path" in whys["LLAMA_ARG_SLOT_SAVE_PATH"]
    assert "llmgw sets it itself" in whys["LLAMA_ARG_API_KEY"]
    assert check_env("llama.cpp", {"LLAMA_ARG_THREADS": "8"}) == []


def test_the_agents_own_variables_are_refused() -> None:
    assert [r.what for r in check_env("vllm", {"CUDA_VISIBLE_DEVICES": "1"})] == ["CUDA_VISIBLE_DEVICES"]
    assert [r.what for r in check_env("vllm", {"CUDA_DEVICE_ORDER": "FASTEST_FIRST"})] == [
        "CUDA_DEVICE_ORDER"
    ]


def test_the_catalog_refuses_bad_args_and_env_naming_each_field() -> None:
    with pytest.raises(ValidationFailed) as caught:
        parse_model(model(args=["--trust-remote-code"], env={"NCCL_NET_PLUGIN": "x"}))
    fields = dict(caught.value.problems)  # type: ignore[attr-defined]
    assert "--trust-remote-code" in fields["profile.args"]
    assert "NCCL_NET_PLUGIN" in fields["profile.env"]


def test_engine_and_weights_format_must_fit() -> None:
    with pytest.raises(ValidationFailed, match="safetensors"):
        parse_model({"name": "m", "source": {"sha256": SHA}, "profile": {"engine": "vllm"}})
    with pytest.raises(ValidationFailed, match="GGUF"):
        parse_model({"name": "m", "source": {"sha256": SHA, "format": "safetensors"}})


def test_vllm_only_features_are_refused_elsewhere() -> None:
    with pytest.raises(ValidationFailed, match="kv_events needs engine vllm"):
        parse_model(model("sglang", kv_events=True))
    with pytest.raises(ValidationFailed, match="tp needs engine"):
        parse_model(model("llama.cpp", tp=2))
    definition = parse_model(model("vllm", tp=2, kv_events=True, max_loaded_adapters=4, gpu_class="h100"))
    assert (definition.profile.tp, definition.profile.max_loaded_adapters) == (2, 4)


def test_a_projector_goes_with_gguf() -> None:
    projector = {"sha256": "b" * 64, "filename": "mmproj.gguf"}
    definition = parse_model({"name": "m", "source": {"sha256": SHA, "projector": projector}})
    assert definition.source.projector is not None
    with pytest.raises(ValidationFailed, match="projector goes with GGUF"):
        parse_model(
            model("vllm") | {"source": {"sha256": SHA, "format": "safetensors", "projector": projector}}
        )
