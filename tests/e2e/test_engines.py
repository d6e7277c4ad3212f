"""A real control plane and agent running the vLLM, SGLang and TensorRT-LLM stand-ins as replicas.

The agent launches each stand-in exactly as it launches the real engine (the
same command line, key, health check); the gateway routes to each and reads
its load by that engine's metric names.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
import zmq

from llmgw.agent.kv_events import decode
from llmgw.testing.block_hashing import block_hash, external, none_hash
from llmgw.testing.cluster import Cluster, wait_for
from llmgw.testing.nvidia_smi_standin import H100_80G, install_fake_nvidia_smi
from llmgw.testing.standin_programs import write_standins

pytestmark = pytest.mark.e2e

MODELS = {"std-vllm": "vllm", "std-sglang": "sglang", "std-trtllm": "trtllm"}


@pytest.fixture(scope="module")
def engines_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    home = tmp_path_factory.mktemp("engines")
    programs = write_standins(home / "standins")
    with Cluster(home / "cluster", home / "cache") as running:
        running.start_server()
        config = b'{"architectures": ["LlamaForCausalLM"]}'
        blob = running.upload(filename="config.json", data=config)
        for name, engine in MODELS.items():
            profile: dict[str, object] = {"engine": engine, "ctx_size": 2048, "parallel": 2}
            if engine == "vllm":
                profile |= {"max_loaded_adapters": 2, "kv_events": True, "args": ["--dtype", "half"]}
            running.admin.request(
                "POST",
                "/api/models",
                {
                    "name": name,
                    "source": {"sha256": blob["sha256"], "filename": "config.json", "format": "safetensors"},
                    "profile": profile,
                },
            )
        running.create_key("tests")
        running.add_node(
            "node1",
            nvidia_smi=str(
                install_fake_nvidia_smi(home / "smi", [H100_80G, H100_80G], driver_version="580.82.07")
            ),
            engines=programs.engine_settings(),
        )
        running.start_agent("node1")
        for name in MODELS:
            running.wait_ready(name, 120)
        yield running


def client(cluster: Cluster) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{cluster.url}/v1", api_key=cluster.key, max_retries=0, timeout=30)


@pytest.mark.parametrize("model", sorted(MODELS))
def test_each_engine_answers_through_the_gateway(engines_cluster: Cluster, model: str) -> None:
    answer = client(engines_cluster).chat.completions.create(
        model=model, messages=[{"role": "user", "content": "Say hello."}], max_tokens=5
    )
    assert answer.choices[0].message.content == " tok0 tok1 tok2 tok3 tok4"
    assert answer.usage is not None and answer.usage.completion_tokens == 5


def test_vllm_streams_through_the_gateway(engines_cluster: Cluster) -> None:
    stream = client(engines_cluster).chat.completions.create(
        model="std-vllm", messages=[{"role": "user", "content": "Count."}], max_tokens=4, stream=True
    )
    pieces = [c.choices[0].delta.content for c in stream if c.choices and c.choices[0].delta.content]
    assert pieces == [" tok0", " tok1", " tok2", " tok3"]


@pytest.mark.parametrize("model", sorted(MODELS))
def test_each_engine_demands_the_replica_key(engines_cluster: Cluster, model: str) -> None:
    replica = engines_cluster.wait_ready(model)
    request = urllib.request.Request(
        f"http://127.0.0.1:{replica['port']}/v1/chat/completions",
        data=b'{"model": "%s", "messages": [], "max_tokens": 1}' % model.encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=10)
    assert caught.value.code == 401


def engine_process(port: int) -> tuple[list[str], dict[str, str]]:
    """The command line and environment of the process serving on ``port`` (this user's, from /proc)."""
    for proc in Path("/proc").iterdir():
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")[:-1]
            if b"--port" in argv and argv[argv.index(b"--port") + 1 :][:1] == [str(port).encode()]:
                pairs = (proc / "environ").read_bytes().split(b"\0")
                environ = dict(p.decode().partition("=")[::2] for p in pairs if b"=" in p)
                return [a.decode() for a in argv], environ
        except (OSError, IndexError):
            continue
    raise AssertionError(f"no process serves on port {port}")


def test_vllm_runs_with_runtime_lora_turned_on(engines_cluster: Cluster, tmp_path: Path) -> None:
    replica = engines_cluster.wait_ready("std-vllm")
    argv, environ = engine_process(replica["port"])
    assert "--enable-lora" in argv and argv[argv.index("--max-loras") + 1] == "2"
    assert environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "").lower() in ("1", "true")
    adapter = tmp_path / "sql"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text('{"peft_type": "LORA", "r": 8}')
    (adapter / "adapter_model.safetensors").write_bytes(b"\0" * 8)

    key = environ["VLLM_API_KEY"]

    def call(path: str, body: dict[str, str]) -> tuple[int, str]:
        request = urllib.request.Request(
            f"http://127.0.0.1:{replica['port']}{path}",
            data=json.dumps(body).encode(),
            headers={
                "Content-Type": "application/json",
                "Authorization": f"Bearer {key}",
            },
            method="POST",
        )
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status, answer.read().decode()

    # vLLM serves these routes only with runtime LoRA on (404 otherwise)
    status, text = call("/v1/load_lora_adapter", {"lora_name": "sql-probe", "lora_path": str(adapter)})
    assert status == 200 and "sql-probe" in text
    status, text = call("/v1/unload_lora_adapter", {"lora_name": "sql-probe"})
    assert status == 200 and "removed" in text


def test_a_refused_profile_names_the_flag(engines_cluster: Cluster) -> None:
    with pytest.raises(Exception) as caught:
        engines_cluster.admin.request(
            "POST",
            "/api/models",
            {
                "name": "bad",
                "source": {"sha256": "a" * 64, "format": "safetensors"},
                "profile": {
                    "engine": "vllm",
                    "args": ["--trust-remote-code"],
                    "env": {"VLLM_HOST_IP": "1.2.3.4"},
                },
            },
        )
    problems = dict(caught.value.problems)  # type: ignore[attr-defined]
    assert "--trust-remote-code" in problems["profile.args"]
    assert "VLLM_HOST_IP" in problems["profile.env"]


def test_engine_logs_show_their_own_command_lines(engines_cluster: Cluster) -> None:
    work = Path(engines_cluster.home) / "nodes" / "node1"
    logs = wait_for(
        lambda: {p.read_text(errors="replace") for p in work.rglob("output-*.log")} or None,
        5,
        "engine output files",
    )
    joined = "\n".join(logs)
    assert "vllm stand-in serving std-vllm" in joined
    assert "sglang stand-in serving std-sglang" in joined
    assert "trtllm stand-in serving" in joined


def test_model_serve_puts_a_safetensors_repository_on_vllm(engines_cluster: Cluster, tmp_path: Path) -> None:
    folder = tmp_path / "tiny-repo"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"\0" * 64)
    (folder / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    (folder / "tokenizer.json").write_text("{}")
    token = (engines_cluster.home / "admin.token").read_text().strip()
    done = subprocess.run(
        [sys.executable, "-m", "llmgw.cli.main", "model", "serve", str(folder), "--format", "safetensors",
         "--gpu-class", "h100-80g", "--tp", "2", "--ctx-size", "1024", "--wait", "60"],
        env={**os.environ, "LLMGW_URL": engines_cluster.url, "LLMGW_ADMIN_TOKEN": token},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "tiny-repo is ready" in done.stdout
    answer = client(engines_cluster).chat.completions.create(
        model="tiny-repo", messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    assert answer.choices[0].message.content == " tok0 tok1"
    replica = engines_cluster.wait_ready("tiny-repo")
    assert replica["on"] == "cuda:0,1"  # both cards, and vLLM said it found CUDA
    shard = next(p for p in (engines_cluster.home / "nodes").rglob("shards/*") if "tiny-repo" in _log(p))
    fetched = {p.name for p in (Path(_arg(shard, "serve"))).iterdir()}
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= fetched


def _log(shard: Path) -> str:
    return "".join(path.read_text(errors="replace") for path in shard.glob("output-*.log"))


def _arg(shard: Path, after: str) -> str:
    """The argument after ``after`` in the command line of the engine running in ``shard``."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().decode().split("\0")
                if Path(f"/proc/{entry}/cwd").resolve() == shard.resolve() and after in argv:
                    return argv[argv.index(after) + 1]
            except OSError:
                continue
    raise AssertionError(f"no engine running in {shard}")


def _engine_process(served_name: str) -> tuple[int, list[str]]:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().decode().split("\0")
            except OSError:
                continue
            if "--served-model-name" in argv and argv[argv.index("--served-model-name") + 1] == served_name:
                return int(entry), argv
    raise AssertionError(f"no engine serving {served_name}")


def test_vllm_publishes_kv_events_the_router_can_recompute(engines_cluster: Cluster) -> None:
    pid, argv = _engine_process("std-vllm")
    config = json.loads(argv[argv.index("--kv-events-config") + 1])
    assert config["endpoint"].startswith("tcp://127.0.0.1:")
    assert argv[argv.index("--prefix-caching-hash-algo") + 1] == "sha256_cbor"
    environ = dict(
        item.split("=", 1)
        for item in Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0")
        if "=" in item
    )
    assert environ["PYTHONHASHSEED"] == "0"
    # The agent listens on the KV-events port; the replay socket gives anyone the batches kept.
    assert config["replay_endpoint"].startswith("tcp://127.0.0.1:")
    context = zmq.Context()
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(config["replay_endpoint"])
    messages = [{"role": "user", "content": " ".join(f"word{i}" for i in range(40))}]
    try:
        client(engines_cluster).chat.completions.create(model="std-vllm", messages=messages, max_tokens=1)
        stored: list[int | bytes] = []
        sizes: set[int] = set()
        dealer.send_multipart([b"", (0).to_bytes(8, "big")])
        while True:
            assert dealer.poll(5000), "the replay socket did not answer"
            _empty, sequence, payload = dealer.recv_multipart()
            if sequence == (-1).to_bytes(8, "big", signed=True):
                break
            for details in decode(payload).stored:  # read as the agent reads them
                stored.extend(details.hashes)
                sizes.add(details.block_size)
    finally:
        dealer.close(0)
        context.term()
    replica = engines_cluster.wait_ready("std-vllm")
    request = urllib.request.Request(
        f"http://127.0.0.1:{replica['port']}/tokenize",
        data=json.dumps({"model": "std-vllm", "messages": messages}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        tokens = json.loads(answer.read())["tokens"]
    [size] = sizes  # the block size the engine's events report
    root, parent, expected = none_hash("0"), None, []
    for start in range(0, len(tokens) - size + 1, size):
        parent = block_hash(parent, tokens[start : start + size], root)
        expected.append(external(parent, True))
    assert expected and set(expected) <= set(stored)


def _listening_pid(port: int) -> int:
    """The engine process whose command line names ``port`` (an engine stand-in: ``python SCRIPT …``)."""
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if len(argv) > 2 and argv[0] == sys.executable.encode() and str(port).encode() in argv:
                return int(entry)
    raise LookupError(f"no engine on port {port}")


def test_a_restarted_agent_adopts_the_console_script_engines_it_started(engines_cluster: Cluster) -> None:
    """vLLM and trtllm-serve are Python console scripts: /proc shows them behind their interpreter."""
    import signal

    before = {name: engines_cluster.wait_ready(name) for name in MODELS}
    pids = {name: _listening_pid(replica["port"]) for name, replica in before.items()}
    engines_cluster.kill("agent-node1", signal.SIGKILL)
    wait_for(
        lambda: all(r["state"] != "ready" for n in MODELS for r in engines_cluster.replicas(n)),
        30,
        "the control plane saw the node go",
    )
    engines_cluster.start_agent("node1")
    for name, replica in before.items():
        after = engines_cluster.wait_ready(name, 60)
        assert (after["port"], after["restarts"]) == (replica["port"], replica["restarts"]), name
        assert _listening_pid(after["port"]) == pids[name], f"{name}'s engine was started again"
    answer = client(engines_cluster).chat.completions.create(
        model="std-vllm", messages=[{"role": "user", "content": "hi"}], max_tokens=2
    )
    assert answer.choices[0].message.content == " tok0 tok1"
