"""Each view draws the fixed data; an event changes what it shows (Textual's pilot)."""

from __future__ import annotations

import copy
import io

from rich.console import Console
from textual.pilot import Pilot
from textual.widgets import DataTable, Static

from llmgw.console.app import ConsoleApp
from llmgw.console.events import Event, Notice
from llmgw.console.overview import attention, overview_table
from llmgw.testing.eventually import eventually

from .fixtures import NOW, REPLICAS, STATUS, FixedSource

SIZE = (160, 40)


def console_app(source: FixedSource) -> ConsoleApp:
    return ConsoleApp(source, now=lambda: NOW)


async def loaded(app: ConsoleApp, pilot: Pilot[None]) -> None:
    await eventually(lambda: app.data.keys, message="every streamed kind arrived")
    await pilot.pause()


def cells(app: ConsoleApp, selector: str) -> list[list[str]]:
    table = app.query_one(selector, DataTable)
    return [[str(c) for c in table.get_row_at(i)] for i in range(table.row_count)]


def text_of(renderable: object) -> str:
    out = Console(width=200, record=True, file=io.StringIO())
    out.print(renderable)
    return "\n".join(" ".join(line.split()) for line in out.export_text().splitlines())


async def test_the_overview_says_who_leads_stands_by_and_what_needs_attention() -> None:
    app = console_app(FixedSource())
    async with app.run_test(size=SIZE) as pilot:
        await loaded(app, pilot)
        shown = text_of(overview_table(app.data, NOW))
    assert "leader cp1" in shown.splitlines()
    assert "standbys cp2" in shown.splitlines()
    assert "floating address 10.0.0.100/24 (on the leader)" in shown.splitlines()
    assert "replicas 1 ready of 3" in shown.splitlines()
    assert dict(attention(app.data, NOW)) == {
        "component usage-writer": "FAILED after 5 restarts: StoreUnavailable: gone (60 s ago)",
        "refused settings on gpu1": "work_dir=/proc/x: cannot write /proc/x",
        "cannot place big": "no node has 80000 MiB free on an a100-80g",
        "replica chat-2": "FAILED on gpu1: engine exited with code 1",
        "node cpu1": "away (last at 10.0.1.2)",
    }


async def test_the_floating_address_off_the_leader_needs_attention() -> None:
    app = console_app(FixedSource())
    async with app.run_test(size=SIZE) as pilot:
        await loaded(app, pilot)
        app.take(Event("status", STATUS | {"vip_on_leader": False}))
        assert ("floating address", "10.0.0.100/24 is NOT on the leader: check keepalived") in attention(
            app.data, NOW
        )


async def test_a_busy_models_queue_shows_who_waits() -> None:
    app = console_app(FixedSource())
    queue = {
        "waiting": 3,
        "by_flow": {"project:acme/ml/eval": 2, "project:acme/ml/chat": 1},
        "last_wait_s": 0.25,
    }
    async with app.run_test(size=SIZE) as pilot:
        await loaded(app, pilot)
        app.take(Event("status", STATUS | {"queues": {"chat": queue}}))
        shown = text_of(overview_table(app.data, NOW))
    assert (
        "queue chat 3 waiting (project:acme/ml/eval 2, project:acme/ml/chat 1), "
        "the latest sent on waited 0.25 s" in shown.splitlines()
    )


async def test_nodes_replicas_and_models_show_their_rows() -> None:
    app = console_app(FixedSource())
    async with app.run_test(size=SIZE) as pilot:
        await loaded(app, pilot)
        nodes, replicas, models = cells(app, "#nodes"), cells(app, "#replicas"), cells(app, "#models")
    assert [row[:3] for row in nodes] == [["gpu1", "yes", "10.0.1.1"], ["cpu1", "AWAY", "10.0.1.2"]]
    assert nodes[0][5] == "1:h100-80g, 0/mig1:a100-3g.40gb"
    assert replicas[0] == ["chat-1", "chat", "gpu1", "ready", "cuda:1 16000 MiB", "21000", "0", "-"]
    assert replicas[1][3:5] == ["failed", "-"]
    assert [row[0] for row in models] == ["chat", "big"]
    assert models[1][-1] == "no node has 80000 MiB free"


async def test_the_gpus_view_joins_each_card_and_mig_instance_to_its_telemetry() -> None:
    app = console_app(FixedSource())
    async with app.run_test(size=SIZE) as pilot:
        await loaded(app, pilot)
        await pilot.press("3")
        await eventually(lambda: app.data.gpus, message="GPU readings fetched")
        await pilot.pause()
        rows = cells(app, "#gpus")
    assert rows == [
        ["gpu1", "1", "NVIDIA H100 80GB HBM3", "h100-80g", "87 %", "64000 / 81559", "64 °C"],
        ["gpu1", "0/mig1", "NVIDIA A100 MIG 3g.40gb", "a100-3g.40gb", "-", "10000 / 40192", "-"],
    ]


async def test_mirror_settings_and_keys_fetch_what_the_stream_does_not_carry() -> None:
    app = console_app(FixedSource())
    async with app.run_test(size=SIZE) as pilot:
        await loaded(app, pilot)
        for key in "678":
            await pilot.press(key)
        await eventually(lambda: app.data.blobs and app.data.history and app.data.usage)
        await pilot.pause()
        mirror = cells(app, "#mirror")
        settings, history = (
            [[str(c) for c in t.get_row_at(i)] for i in range(t.row_count)]
            for t in app.query("#settings DataTable").results(DataTable)
        )
        keys, usage = (
            [[str(c) for c in t.get_row_at(i)] for i in range(t.row_count)]
            for t in app.query("#keys DataTable").results(DataTable)
        )
    assert mirror == [["chat.gguf", "weights", "94.0", "abababababababab"]]
    assert settings == [["gateway.request_wait_s", "30"], ["shards.liveness_s", "45"]]
    assert history == [["2026-11-02 09:00:00", "admin", "shards.liveness_s", "= 45"]]
    assert keys[0][:4] == ["k-1", "chat-app", "llmgw-ab12", "project:acme/web/chat"]
    assert usage == [["2026-11", "chat-app", "120", "2", "5000", "8000"]]


async def test_the_training_view_fetches_the_jobs_with_their_progress_and_why_one_waits() -> None:
    app = console_app(FixedSource())
    async with app.run_test(size=SIZE) as pilot:
        await loaded(app, pilot)
        await pilot.press("9")
        await eventually(lambda: app.data.training, message="training jobs fetched")
        await pilot.pause()
        jobs = cells(app, "#training")
    assert jobs == [
        ["tj_0123456789ab", "chat", "team:acme/ml", "training", "gpu1/1", "40/100", "0.8123", "6144", "-"],
        [
            "tj_ba9876543210", "chat", "cluster", "queued", "(any)", "-", "-", "-",
            "gpu1: card 1: 20000 MiB free, the job needs 90000",
        ],
    ]  # fmt: skip


async def test_the_batches_view_fetches_the_batches_with_their_progress() -> None:
    app = console_app(FixedSource())
    async with app.run_test(size=SIZE) as pilot:
        await loaded(app, pilot)
        await pilot.press("0")
        await eventually(lambda: app.data.batches, message="batches fetched")
        await pilot.pause()
        batches = cells(app, "#batches")
    assert batches == [
        [
            "batch_0123456789abcdef01234567", "project:acme/ml/chat", "/v1/chat/completions", "in_progress",
            "423/1000  42 %", "3", "12000/2100", "-",
        ],
    ]  # fmt: skip


async def test_a_replicas_event_changes_the_replicas_view() -> None:
    source = FixedSource()
    app = console_app(source)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(app, pilot)
        changed = copy.deepcopy(REPLICAS)
        changed[1] |= {"state": "ready", "on": "cuda:1 15000 MiB", "error": ""}
        await source.events.put(Event("replicas", changed))
        await eventually(
            lambda: cells(app, "#replicas")[1][3] == "ready", message="the view shows chat-2 ready"
        )
        assert cells(app, "#replicas")[1][4] == "cuda:1 15000 MiB"


async def test_a_notice_shows_on_the_status_line_and_trouble_is_marked() -> None:
    source = FixedSource()
    app = console_app(source)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(app, pilot)
        await source.events.put(Notice("cannot reach http://cp1.example:8080: refused", trouble=True))
        line = app.query_one("#statusline", Static)
        await eventually(lambda: line.has_class("trouble"), message="the status line marked as trouble")
        assert app.notice.text == "cannot reach http://cp1.example:8080: refused"


async def test_a_shape_the_console_cannot_read_is_said_not_shown() -> None:
    source = FixedSource()
    app = console_app(source)
    async with app.run_test(size=SIZE) as pilot:
        await loaded(app, pilot)
        await source.events.put(Event("nodes", [{"id": "x"}]))
        await eventually(lambda: "does not read" in app.notice.text)
        assert [row[0] for row in cells(app, "#nodes")] == ["gpu1", "cpu1"]
