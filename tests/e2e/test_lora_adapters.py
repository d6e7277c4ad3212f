"""LoRA adapters of a model definition, end to end: a real control plane and agent, stand-in engines.

Three models carry adapters: a vLLM model holding at most one adapter per
replica (loaded at run time by the router), a vLLM model given its adapter at
start (``--lora-modules``), and a llama.cpp model given two GGUF adapters at
start (``--lora``, ``--lora-scaled``). The agent fetches every adapter's files
from the mirror; the engines check the paths they are given exist.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai
import pytest

from llmgw.testing.cluster import Cluster
from llmgw.testing.llama_server_standin import write_launcher
from llmgw.testing.nvidia_smi_standin import H100_80G, install_fake_nvidia_smi
from llmgw.testing.standin_programs import write_standins

pytestmark = pytest.mark.e2e

RUNTIME, STATIC, GGUF = "lora-runtime", "lora-static", "lora-gguf"
LOAD_S = "0.4"
"""Seconds the vLLM stand-in takes to load an adapter: long enough for requests to pile up behind it."""


def _upload(cluster: Cluster, filename: str, data: bytes) -> dict[str, Any]:
    blob = cluster.upload(filename=filename, data=data)
    return {"sha256": blob["sha256"], "filename": filename}


def _peft(cluster: Cluster, name: str, rank: int) -> dict[str, Any]:
    weights = _upload(cluster, "adapter_model.safetensors", f"{name} lora weights".encode())
    config = _upload(cluster, "adapter_config.json", json.dumps({"peft_type": "LORA", "r": rank}).encode())
    return {"name": name, **weights, "files": [config], "rank": rank}


@pytest.fixture(scope="module")
def lora_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    home = tmp_path_factory.mktemp("lora")
    programs = write_standins(home / "standins")
    launcher = write_launcher(home / "bin" / "llama-server")
    running = Cluster(home / "cluster", home / "cache")
    before = os.environ.get("LLMGW_STANDIN_LORA_LOAD_S")
    os.environ["LLMGW_STANDIN_LORA_LOAD_S"] = LOAD_S  # the agent passes its environment to the engines
    try:
        running.start_server()
        base = _upload(running, "config.json", b'{"architectures": ["LlamaForCausalLM"]}')
        vllm = {"engine": "vllm", "ctx_size": 2048, "parallel": 8}
        models: list[dict[str, Any]] = [
            {
                "name": RUNTIME,
                "source": {**base, "format": "safetensors"},
                "profile": {**vllm, "max_loaded_adapters": 1},
                "adapters": [_peft(running, "ad-a", 8), _peft(running, "ad-b", 16)],
            },
            {
                "name": STATIC,
                "source": {**base, "format": "safetensors"},
                "profile": vllm,
                "adapters": [_peft(running, "ad-static", 32)],
            },
            {
                "name": GGUF,
                "source": _upload(running, "model.gguf", b"GGUF stand-in\n"),
                "adapters": [
                    {
                        "name": "ad-gguf-half",
                        **_upload(running, "half.gguf", b"GGUF lora half"),
                        "scale": 0.5,
                    },
                    {"name": "ad-gguf-full", **_upload(running, "full.gguf", b"GGUF lora full")},
                ],
            },
        ]
        for model in models:
            running.admin.request("POST", "/api/models", model)
        running.create_key("tests")
        running.add_node(
            "node1",
            nvidia_smi=str(install_fake_nvidia_smi(home / "smi", [H100_80G], driver_version="580.82.07")),
            engines={"vllm": {"program": str(programs.vllm)}, "llamacpp": {"binary": str(launcher)}},
        )
        running.start_agent("node1")
        for model in models:
            running.wait_ready(model["name"], 60)
        yield running
    finally:
        if before is None:
            os.environ.pop("LLMGW_STANDIN_LORA_LOAD_S", None)
        else:
            os.environ["LLMGW_STANDIN_LORA_LOAD_S"] = before
        running.stop()


def client(cluster: Cluster) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{cluster.url}/v1", api_key=cluster.key, max_retries=0, timeout=30)


def ask(cluster: Cluster, model: str) -> str:
    answer = client(cluster).chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    return answer.choices[0].message.content or ""


def engine_argv(flag: str, value: str) -> list[str]:
    """The command line of the engine started with ``flag value`` (``--served-model-name`` or ``--alias``)."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().decode().split("\0")
            except OSError:
                continue
            if flag in argv and argv[argv.index(flag) + 1] == value:
                return argv
    raise AssertionError(f"no engine started with {flag} {value}")


def engine_get(cluster: Cluster, model: str, path: str, flag: str = "--served-model-name") -> Any:
    """GET ``path`` from ``model``'s engine itself, with the replica's key from its shard's state."""
    engine_argv(flag, model)  # its engine runs
    port = cluster.wait_ready(model)["port"]
    key = cluster.engine_key(port)
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", headers={"Authorization": f"Bearer {key}"}
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        return json.loads(answer.read())


def engine_adapters(cluster: Cluster, model: str) -> dict[str, str]:
    """The adapters ``model``'s vLLM engine serves now, with the paths it loaded them from."""
    listing = engine_get(cluster, model, "/v1/models")["data"]
    return {m["id"]: m["root"] for m in listing if m.get("parent") == model}


def adapter_loads(cluster: Cluster, model: str) -> float:
    """The gateway's count of runtime adapter loads for ``model``."""
    text = cluster.metrics()
    found = re.search(rf'^llmgw_adapter_loads_total\{{model="{model}"\}} (\S+)$', text, re.MULTILINE)
    return float(found[1]) if found else 0.0


def test_v1_models_lists_each_adapter_with_its_base_model(lora_cluster: Cluster) -> None:
    request = urllib.request.Request(
        f"{lora_cluster.url}/v1/models", headers={"Authorization": f"Bearer {lora_cluster.key}"}
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        listed = {m["id"]: m.get("parent") for m in json.loads(answer.read())["data"]}
    assert listed == {
        RUNTIME: None, "ad-a": RUNTIME, "ad-b": RUNTIME,
        STATIC: None, "ad-static": STATIC,
        GGUF: None, "ad-gguf-half": GGUF, "ad-gguf-full": GGUF,
    }  # fmt: skip


def test_an_unknown_adapter_is_a_model_that_does_not_exist(lora_cluster: Cluster) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        ask(lora_cluster, "ad-nowhere")
    assert caught.value.code == "model_not_found"


def test_the_replica_reports_where_the_node_keeps_each_adapter(lora_cluster: Cluster) -> None:
    replica = lora_cluster.wait_ready(RUNTIME)
    assert set(replica["adapters"]) == {"ad-a", "ad-b"}
    for path in replica["adapters"].values():
        assert {p.name for p in Path(path).iterdir()} == {"adapter_model.safetensors", "adapter_config.json"}


def test_runtime_adapters_load_on_first_use_and_the_least_recent_makes_room(lora_cluster: Cluster) -> None:
    paths = lora_cluster.wait_ready(RUNTIME)["adapters"]
    for name in ("ad-a", "ad-b", "ad-a"):
        assert ask(lora_cluster, name) == " tok0 tok1"
        assert engine_adapters(lora_cluster, RUNTIME) == {name: paths[name]}  # one slot: the other went
    argv = engine_argv("--served-model-name", RUNTIME)
    assert "--lora-modules" not in argv and argv[argv.index("--max-lora-rank") + 1] == "16"


def test_many_first_requests_for_one_adapter_load_it_once(lora_cluster: Cluster) -> None:
    held = engine_adapters(lora_cluster, RUNTIME)
    cold = next(name for name in ("ad-a", "ad-b") if name not in held)
    loads = adapter_loads(lora_cluster, RUNTIME)
    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(lambda _: ask(lora_cluster, cold), range(12)))
    assert answers == [" tok0 tok1"] * 12  # a second load would have been refused: already loaded
    assert adapter_loads(lora_cluster, RUNTIME) == loads + 1
    assert set(engine_adapters(lora_cluster, RUNTIME)) == {cold}


def test_vllm_is_given_an_adapter_at_start_without_a_runtime_limit(lora_cluster: Cluster) -> None:
    argv = engine_argv("--served-model-name", STATIC)
    name, _, path = argv[argv.index("--lora-modules") + 1].partition("=")
    assert (name, argv[argv.index("--max-lora-rank") + 1]) == ("ad-static", "32")
    assert "--enable-lora" in argv and (Path(path) / "adapter_config.json").is_file()
    assert engine_adapters(lora_cluster, STATIC) == {"ad-static": path}
    loads = adapter_loads(lora_cluster, STATIC)
    assert ask(lora_cluster, "ad-static") == " tok0 tok1"
    assert adapter_loads(lora_cluster, STATIC) == loads  # nothing to load: the engine has it


def test_llamacpp_is_given_every_adapter_at_start_with_its_scale(lora_cluster: Cluster) -> None:
    loaded = engine_get(lora_cluster, GGUF, "/lora-adapters", flag="--alias")
    assert [(Path(a["path"]).name, a["scale"]) for a in loaded] == [("half.gguf", 0.5), ("full.gguf", 1.0)]
    argv = engine_argv("--alias", GGUF)
    assert argv[argv.index("--lora-scaled") + 1].endswith("half.gguf:0.5")
    assert argv[argv.index("--lora") + 1].endswith("full.gguf")


@pytest.mark.parametrize(
    ("model", "asked"),
    [("ad-gguf-half", [(0, 0.5)]), ("ad-gguf-full", [(1, 1.0)]), (GGUF, [(0, 0.0)])],
    ids=["half", "full", "model-alone"],
)
def test_llamacpp_applies_only_the_adapter_a_request_names(
    lora_cluster: Cluster, model: str, asked: list[tuple[int, float]]
) -> None:
    assert ask(lora_cluster, model)
    slots = engine_get(lora_cluster, GGUF, "/slots", flag="--alias")
    assert [(e["id"], e["scale"]) for e in slots[0]["params"]["lora"]] == asked  # the others: scale 0


def test_an_adapter_whose_file_is_not_in_the_mirror_is_refused_by_field(lora_cluster: Cluster) -> None:
    with pytest.raises(Exception) as caught:
        lora_cluster.admin.request(
            "POST",
            "/api/models",
            {
                "name": "lora-missing",
                "source": lora_cluster.admin.get(f"/api/models/{GGUF}")["definition"]["source"],
                "adapters": [{"name": "ad-a", "sha256": "f" * 64, "filename": "x.gguf"}],
            },
        )
    problems = dict(caught.value.problems)  # type: ignore[attr-defined]
    assert "already the name of an adapter of model 'lora-runtime'" in problems["adapters.0.name"]
    assert "in the mirror" in problems["adapters.0.sha256"]


def test_model_serve_uploads_an_adapter_folder_and_serves_it(lora_cluster: Cluster, tmp_path: Path) -> None:
    repository, adapter = tmp_path / "tiny-repo", tmp_path / "tiny-sql"
    repository.mkdir()
    (repository / "model.safetensors").write_bytes(b"\0" * 64)
    (repository / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    adapter.mkdir()
    (adapter / "adapter_model.safetensors").write_bytes(b"\1" * 64)
    (adapter / "adapter_config.json").write_text('{"peft_type": "LORA", "r": 4}')
    done = subprocess.run(
        [sys.executable, "-m", "llmgw.cli.main", "model", "serve", str(repository), "--adapter",
         f"tiny-sql={adapter}", "--ctx-size", "1024", "--wait", "60"],
        env={**os.environ, "LLMGW_URL": lora_cluster.url, "LLMGW_ADMIN_TOKEN": lora_cluster.token},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert ask(lora_cluster, "tiny-sql") == " tok0 tok1"
    argv = engine_argv("--served-model-name", "tiny-repo")
    name, _, path = argv[argv.index("--lora-modules") + 1].partition("=")
    assert name == "tiny-sql" and (Path(path) / "adapter_model.safetensors").read_bytes() == b"\1" * 64
    assert argv[argv.index("--max-lora-rank") + 1] == "8"  # rank 4 of the config: vLLM's smallest above
