"""llmgw's ComfyUI readers against ComfyUI 0.3.64's messages; the stand-in held to them.

The recordings in ``data/`` were written from ComfyUI 0.3.64's ``server.py``,
``main.py``, ``execution.py`` and ``comfy_execution/`` (commit 6372219):
the websocket frames one prompt's run sends its client (finished, failed,
interrupted), ``GET /history/{prompt_id}`` after each, ``GET /queue`` with
one running and one waiting, and ``POST /prompt``'s 400 answers. Each names
its source in its first line or fields.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from llmgw.engines.comfyui_progress import DONE, FAILED, RUNNING, Progress
from llmgw.gateway.gate import _refusal, missing_node
from llmgw.testing import comfyui_standin
from llmgw.testing.comfyui_standin_run import Settings

DATA = Path(__file__).parent / "data"
VERSION = "0.3.64"
COMMIT = "637221995f7424a561bd825de3e61ea117dfe1e3"
RUNS = ("success", "error", "interrupted")


def header_and_messages(run: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    lines = (DATA / f"comfyui-{VERSION}-websocket-{run}.jsonl").read_text().splitlines()
    return json.loads(lines[0]), [json.loads(line) for line in lines[1:]]


def messages(run: str) -> list[dict[str, Any]]:
    return header_and_messages(run)[1]


def document(name: str) -> dict[str, Any]:
    return json.loads((DATA / f"comfyui-{VERSION}-{name}.json").read_text())  # type: ignore[no-any-return]


def history(run: str) -> tuple[str, dict[str, Any]]:
    [(prompt_id, record)] = document(f"history-{run}")["answer"].items()
    return prompt_id, record


def workflow(run: str) -> dict[str, Any]:
    return history(run)[1]["prompt"][2]  # type: ignore[no-any-return]


@pytest.mark.parametrize("name", [f"websocket-{run}" for run in RUNS] + [f"history-{run}" for run in RUNS]
                         + ["queue", "prompt-refused"])  # fmt: skip
def test_each_recording_names_its_source_version_and_how_it_was_written(name: str) -> None:
    path = DATA / f"comfyui-{VERSION}-{name}.{'jsonl' if name.startswith('websocket') else 'json'}"
    text = path.read_text()
    head = json.loads(text.splitlines()[0] if path.suffix == ".jsonl" else text)
    assert head["source"] == "github.com/Comfy-Org/ComfyUI" and head["version"] == VERSION
    assert head["commit"] == COMMIT and head["paths"]
    assert head["written"].startswith("from that code, not captured from a running ComfyUI")


def followed(run: str, skip: str = "") -> Progress:
    """A gate's progress after the recorded run's messages (but those of type ``skip``)."""
    progress = Progress()
    progress.queued(history(run)[0])
    for message in messages(run):
        if message["type"] != skip:
            progress.message(message)
    return progress


def test_a_finished_run_reads_as_done_with_its_picture_and_its_steps() -> None:
    prompt_id, record = history("success")
    progress = Progress()
    progress.queued(prompt_id)
    seen = []
    for message in messages("success"):
        progress.message(message)
        entry = progress.get(prompt_id)
        assert entry is not None
        seen.append((entry.state, entry.step, entry.steps))
    assert (RUNNING, 1, 4) in seen and (RUNNING, 4, 4) in seen
    entry = progress.get(prompt_id)
    assert entry is not None and entry.view()["state"] == DONE and entry.view()["percent"] == 100.0
    assert entry.outputs == record["outputs"]["9"]["images"]


def test_a_failed_run_reads_as_failed_naming_its_node_and_comfyuis_message() -> None:
    entry = followed("error").get(history("error")[0])
    assert entry is not None and entry.state == FAILED
    assert entry.error is not None
    assert entry.error.startswith("KSampler (node 3) failed: Allocation on device")
    assert "ran out of memory on your GPU" in entry.error  # ComfyUI's own tip comes along


def test_an_interrupted_run_reads_as_interrupted_at_its_last_step() -> None:
    entry = followed("interrupted").get(history("interrupted")[0])
    assert entry is not None
    assert (entry.state, entry.error, entry.step, entry.steps) == (FAILED, "interrupted", 3, 20)


@pytest.mark.parametrize("run", RUNS)
def test_history_settles_a_run_as_the_websocket_does(run: str) -> None:
    prompt_id, record = history(run)
    from_socket = followed(run).get(prompt_id)
    progress = Progress()
    progress.queued(prompt_id)
    progress.from_history(prompt_id, record)
    from_history = progress.get(prompt_id)
    assert from_socket is not None and from_history is not None
    assert (from_history.state, from_history.error, from_history.outputs) == (
        from_socket.state,
        from_socket.error,
        from_socket.outputs,
    )


@pytest.mark.parametrize("run", ["error", "interrupted"])
def test_the_last_executing_message_of_a_run_that_failed_does_not_make_it_done(run: str) -> None:
    """ComfyUI's worker sends ``executing`` with no node after every run, failed ones too: a gate whose
    socket missed the failure (it was reconnecting) leaves the run to its ``/history`` record."""
    prompt_id, record = history(run)
    progress = followed(run, skip=f"execution_{run}")
    entry = progress.get(prompt_id)
    assert entry is not None and entry.state != DONE
    progress.from_history(prompt_id, record)
    assert entry.state == FAILED and entry.error == followed(run).get(prompt_id).error  # type: ignore[union-attr]


def test_a_refused_unknown_node_and_a_missing_input_read_as_comfyui_says_them() -> None:
    answers = document("prompt-refused")["answers"]
    unknown, missing = answers["unknown_node"], answers["missing_input"]
    assert unknown["status"] == missing["status"] == 400
    assert missing_node(unknown["body"]) == ("FaceDetailer", "10")
    assert missing_node(missing["body"]) is None
    said = "Prompt outputs failed validation; node 3: Required input is missing model"
    assert _refusal(missing["body"]) == said


# -- the stand-in ---------------------------------------------------------------------------------


def test_the_stand_in_says_which_version_it_imitates() -> None:
    assert comfyui_standin.IMITATES == VERSION


@pytest.fixture
async def standin(tmp_path: Path) -> AsyncIterator[tuple[str, aiohttp.ClientSession, web.Application]]:
    directories = {kind: tmp_path / kind for kind in ("output", "temp", "input")}
    for directory in directories.values():
        directory.mkdir()
    app = comfyui_standin.build_app(Settings(tmp_path, directories, step_s=0.03))
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    async with aiohttp.ClientSession() as client:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}", client, app
    await runner.cleanup()


def shape(message: dict[str, Any]) -> tuple[Any, ...]:
    """A message's type, its node, and the keys of its data (and of each node a progress_state holds)."""
    data = message["data"]
    nodes = data.get("nodes")
    states = (
        tuple(sorted((node, entry["state"], tuple(sorted(entry))) for node, entry in nodes.items()))
        if message["type"] == "progress_state"
        else ()
    )
    return message["type"], data.get("node", data.get("node_id")), tuple(sorted(data)), states


def steps_as_one(shapes: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """The sequence with a sampler's steps (each a ``progress_state`` then a ``progress``) as one item:
    how many steps ran before an interrupt is a matter of timing."""
    out: list[tuple[Any, ...]] = []
    at = 0
    while at < len(shapes):
        if shapes[at][0] == "progress_state" and at + 1 < len(shapes) and shapes[at + 1][0] == "progress":
            steps = ("steps", shapes[at + 1][1], shapes[at], shapes[at + 1])
            if not out or out[-1] != steps:
                out.append(steps)
            at += 2
            continue
        out.append(shapes[at])
        at += 1
    return out


async def run_on_standin(
    url: str, client: aiohttp.ClientSession, prompt: dict[str, Any], interrupt_after: int | None = None
) -> tuple[str, list[dict[str, Any]]]:
    sid = header_and_messages("success")[1][0]["data"]["sid"]
    got: list[dict[str, Any]] = []
    async with client.ws_connect(f"{url}/ws?clientId={sid}") as ws:
        got.append(await ws.receive_json())
        async with client.post(f"{url}/prompt", json={"prompt": prompt, "client_id": sid}) as answer:
            prompt_id = (await answer.json())["prompt_id"]
        while True:
            message = await asyncio.wait_for(ws.receive_json(), 10)
            got.append(message)
            if message["type"] == "progress" and message["data"]["value"] == interrupt_after:
                async with client.post(f"{url}/interrupt", json={"prompt_id": prompt_id}) as answer:
                    assert answer.status == 200
            if message["type"] == "executing" and message["data"]["node"] is None:
                return prompt_id, got


async def test_the_stand_in_sends_a_finished_runs_messages_as_comfyui_does(
    standin: tuple[str, aiohttp.ClientSession, web.Application],
) -> None:
    url, client, _ = standin
    _, got = await run_on_standin(url, client, workflow("success"))
    assert [shape(m) for m in got] == [shape(m) for m in messages("success")]


async def test_the_stand_in_sends_a_failed_runs_messages_as_comfyui_does(
    standin: tuple[str, aiohttp.ClientSession, web.Application],
) -> None:
    url, client, _ = standin
    failing = workflow("error")
    failing["3"] = {**failing["3"], "class_type": "StandinFail"}  # fails where ComfyUI's KSampler did
    _, got = await run_on_standin(url, client, failing)
    assert [shape(m) for m in got] == [shape(m) for m in messages("error")]


async def test_the_stand_in_sends_an_interrupted_runs_messages_as_comfyui_does(
    standin: tuple[str, aiohttp.ClientSession, web.Application],
) -> None:
    url, client, _ = standin
    _, got = await run_on_standin(url, client, workflow("interrupted"), interrupt_after=2)
    assert steps_as_one([shape(m) for m in got]) == steps_as_one([shape(m) for m in messages("interrupted")])


def keys_of(value: Any) -> Any:
    """The structure of a JSON value: dict keys (recursively), list lengths and element structure."""
    if isinstance(value, dict):
        return {key: keys_of(item) for key, item in value.items()}
    if isinstance(value, list):
        return [keys_of(item) for item in value]
    return type(value).__name__


@pytest.mark.parametrize("run", RUNS)
async def test_the_stand_ins_history_records_are_shaped_as_comfyuis(
    standin: tuple[str, aiohttp.ClientSession, web.Application], run: str
) -> None:
    url, client, _ = standin
    prompt = workflow(run)
    if run == "error":
        prompt["3"] = {**prompt["3"], "class_type": "StandinFail"}
    stop = 2 if run == "interrupted" else None
    prompt_id, _ = await run_on_standin(url, client, prompt, interrupt_after=stop)
    async with client.get(f"{url}/history/{prompt_id}") as answer:
        [(key, mine)] = (await answer.json()).items()
    _, real = history(run)
    assert key == prompt_id and list(mine) == list(real) == ["prompt", "outputs", "status", "meta"]
    assert keys_of(mine["prompt"][3]) == keys_of(real["prompt"][3]) and mine["prompt"][4] == real["prompt"][4]
    assert [type(item) for item in mine["prompt"]] == [type(item) for item in real["prompt"]]
    assert {node: keys_of(ui) for node, ui in mine["outputs"].items()} == keys_of(real["outputs"])
    assert keys_of(mine["meta"]) == keys_of(real["meta"])
    assert list(mine["status"]) == list(real["status"]) == ["status_str", "completed", "messages"]
    assert (mine["status"]["status_str"], mine["status"]["completed"]) == (
        real["status"]["status_str"],
        real["status"]["completed"],
    )
    assert [(kind, sorted(data)) for kind, data in mine["status"]["messages"]] == [
        (kind, sorted(data)) for kind, data in real["status"]["messages"]
    ]


async def test_the_stand_ins_queue_is_shaped_as_comfyuis(
    standin: tuple[str, aiohttp.ClientSession, web.Application],
) -> None:
    url, client, _ = standin
    slow = workflow("interrupted")
    slow["3"] = {**slow["3"], "inputs": {**slow["3"]["inputs"], "steps": 1000}}
    ids = []
    for _ in range(2):
        async with client.post(f"{url}/prompt", json={"prompt": slow, "client_id": "gate"}) as answer:
            ids.append((await answer.json())["prompt_id"])
    async with client.get(f"{url}/queue") as answer:
        mine = await answer.json()
    real = document("queue")["answer"]
    assert list(mine) == list(real) == ["queue_running", "queue_pending"]
    for name in real:
        assert [keys_of(item) == keys_of(real[name][0]) for item in mine[name]] == [True]
    assert [mine["queue_running"][0][1], mine["queue_pending"][0][1]] == ids
    for prompt_id in ids[::-1]:
        async with client.post(f"{url}/queue", json={"delete": [prompt_id]}):
            pass
        async with client.post(f"{url}/interrupt", json={"prompt_id": prompt_id}):
            pass


async def test_the_stand_in_refuses_an_unknown_node_as_comfyui_does(
    standin: tuple[str, aiohttp.ClientSession, web.Application],
) -> None:
    url, client, _ = standin
    refused = document("prompt-refused")["answers"]["unknown_node"]
    async with client.post(f"{url}/prompt", json=refused["request"]) as answer:
        assert (answer.status, await answer.json()) == (refused["status"], refused["body"])
