"""The Do menu's operations on machines and models, driven through the console against real parts.

Wiping runs on a data directory ``server init`` made; presets and models from
files go to a real admin API. (Adding a node or a control plane over SSH is
driven against the test kit's sshd with the CLI's own tests, in
``tests/e2e/test_node_add.py`` and ``tests/e2e/test_node_add_server.py``.)
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from textual.pilot import Pilot
from textual.widgets import Checkbox, Input, Log, OptionList, Select, Static

from llmgw.cli.server import initialise
from llmgw.client.admin import AdminClient
from llmgw.console.app import ConsoleApp
from llmgw.console.dialogs import (
    ACTIONS,
    AddControlPlaneDialog,
    AddModelDialog,
    AddNodeDialog,
    AddPresetDialog,
    Confirm,
    Running,
    WipeDialog,
)
from llmgw.console.source import AdminSource
from llmgw.core.presets import PRESETS
from llmgw.testing.eventually import eventually

from .fixtures import NOW, FixedSource

SIZE = (160, 48)
HOST = "scratchhost"
SMOLLM2 = "smollm2-135m-instruct"


def text_of(app: ConsoleApp, selector: str) -> str:
    return str(app.screen.query_one(selector, Static).render())


async def choose(app: ConsoleApp, pilot: Pilot[None], action: str) -> None:
    """Open the Do menu and pick ``action``."""
    await pilot.press("d")
    await eventually(lambda: app.screen.query("#do-actions"), message="the Do menu opens")
    menu = app.screen.query_one(OptionList)
    menu.highlighted = menu.get_option_index(action)
    await pilot.press("enter")


async def click(app: ConsoleApp, pilot: Pilot[None], selector: str) -> None:
    await eventually(lambda: app.screen.query(selector), message=f"{selector} is shown")
    button = app.screen.query_one(selector)
    button.scroll_visible(animate=False)
    # a button ignores a click while it still shows the last one (-active, 0.2 s)
    await eventually(lambda: not button.has_class("-active"), message=f"{selector} takes clicks")
    await pilot.pause()
    await pilot.click(selector)


async def test_every_do_entry_is_offered_and_the_machine_ones_open_their_forms() -> None:
    app = ConsoleApp(FixedSource(), now=lambda: NOW)
    forms = {
        "add-preset": AddPresetDialog,
        "add-node": AddNodeDialog,
        "add-control-plane": AddControlPlaneDialog,
        "wipe": WipeDialog,
    }
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("d")
        await eventually(lambda: app.screen.query("#do-actions"))
        menu = app.screen.query_one(OptionList)
        options = [menu.get_option_at_index(i) for i in range(menu.option_count)]
        assert [o.id for o in options] == [action for action, _ in ACTIONS]
        assert not any(o.disabled for o in options)
        await pilot.press("escape")
        for action, form in forms.items():
            await choose(app, pilot, action)
            name = form.__name__
            await eventually(lambda: type(app.screen).__name__ == name, message=f"{action}'s form")  # noqa: B023
            await pilot.press("escape")
            await eventually(lambda: not app.screen.query("#ok"), message=f"{action}'s form closes")


@pytest.fixture
def machine(tmp_path: Path) -> Path:
    """A root with llmgw as ``llmgw server init`` leaves it (CA, token, server.yaml, SQLite store) and a
    blob in its mirror."""
    root = tmp_path / "machine"
    (root / "etc").mkdir(parents=True)
    (root / "etc/hostname").write_text(HOST + "\n")
    config = initialise(
        root / "etc/llmgw",
        name="cp1",
        http_host="127.0.0.1",
        http_port=8080,
        agent_host="127.0.0.1",
        agent_port=8443,
    )
    blob = config.data_path / "mirror" / "blobs" / "ab"
    blob.parent.mkdir(parents=True)
    blob.write_bytes(b"weights")
    return root


async def test_the_ssh_forms_say_in_place_what_the_commands_refuse(
    machine: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    for name in ("LLMGW_URL", "LLMGW_ADMIN_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LLMGW_CLIENT_CONFIG", str(tmp_path / "none.yaml"))
    app = ConsoleApp(FixedSource(), now=lambda: NOW)
    async with app.run_test(size=SIZE) as pilot:
        await choose(app, pilot, "add-control-plane")
        await eventually(lambda: isinstance(app.screen, AddControlPlaneDialog) and app.screen.query("#host"))
        app.screen.query_one("#name", Input).value = "cp2"
        await click(app, pilot, "#ok")
        await eventually(lambda: "HOST: required" in text_of(app, "#problem"))
        app.screen.query_one("#host", Input).value = "10.0.0.12"
        app.screen.query_one("#config", Input).value = str(machine / "etc/llmgw/server.yaml")
        await click(app, pilot, "#ok")
        await eventually(lambda: "the cluster's store is SQLite" in text_of(app, "#problem"))
        assert "move the store to PostgreSQL" in text_of(app, "#problem")
        assert isinstance(app.screen, AddControlPlaneDialog)


async def test_wipe_lists_what_goes_wants_the_machines_name_then_removes_it(
    machine: Path, tmp_path: Path
) -> None:
    config_dir = machine / "etc/llmgw"
    assert (config_dir / "llmgw.db").exists()
    app = ConsoleApp(FixedSource(), now=lambda: NOW)
    async with app.run_test(size=SIZE) as pilot:
        await choose(app, pilot, "wipe")
        await eventually(lambda: isinstance(app.screen, WipeDialog) and app.screen.query("#root"))
        (tmp_path / "empty").mkdir()
        app.screen.query_one("#root", Input).value = str(tmp_path / "empty")
        await click(app, pilot, "#ok")
        await eventually(lambda: "nothing of llmgw is here" in text_of(app, "#problem"))

        app.screen.query_one("#root", Input).value = str(machine)
        app.screen.query_one("#store", Checkbox).value = True
        await click(app, pilot, "#ok")
        await eventually(lambda: isinstance(app.screen, Confirm), message="the question")
        question = text_of(app, "#question")
        assert f"Wipe llmgw from {HOST}?" in question
        assert str(config_dir) in question and f"keeping {config_dir / 'mirror'}" in question
        assert "llmgw.db" not in question  # the store goes with the configuration: it is not kept

        app.screen.query_one("#typed", Input).value = "otherhost"
        await click(app, pilot, "#yes")
        await eventually(
            lambda: "'otherhost' is not 'scratchhost': nothing was removed" in text_of(app, "#problem")
        )
        assert isinstance(app.screen, Confirm) and (config_dir / "server.yaml").exists()

        app.screen.query_one("#typed", Input).value = HOST
        await click(app, pilot, "#yes")
        await eventually(lambda: isinstance(app.screen, Running), message="the wipe runs")
        await eventually(lambda: "wiped llmgw from scratchhost" in text_of(app, "#result"))
        progress = "\n".join(app.screen.query_one("#progress", Log).lines)
        assert f"configuration  {config_dir}: removed, keeping" in progress
        await click(app, pilot, "#close")
        await eventually(lambda: "wiped llmgw" in app.notice.text)
    assert not (config_dir / "server.yaml").exists() and not (config_dir / "ca.key").exists()
    assert not (config_dir / "llmgw.db").exists()
    assert (config_dir / "mirror/blobs/ab").read_bytes() == b"weights"


async def test_a_preset_is_added_with_its_packaged_weights_and_one_without_says_how_to_get_them(
    admin_client: AdminClient,
) -> None:
    app = ConsoleApp(AdminSource(admin_client, poll_s=0.2), now=lambda: NOW)
    async with app.run_test(size=SIZE) as pilot:
        await choose(app, pilot, "add-preset")
        await eventually(lambda: isinstance(app.screen, AddPresetDialog) and app.screen.query("#preset"))
        app.screen.query_one("#preset", Select).value = "flux-schnell"
        await click(app, pilot, "#ok")
        await eventually(
            lambda: "llmgw ctl mirror pull hf:Comfy-Org/flux1-schnell" in text_of(app, "#problem")
        )
        assert "needs: flux1-schnell-fp8.safetensors in the mirror" in text_of(app, "#needs")

        app.screen.query_one("#preset", Select).value = SMOLLM2
        await click(app, pilot, "#ok")
        await eventually(lambda: isinstance(app.screen, Confirm), message="the question")
        assert f"uploading {PRESETS[SMOLLM2].filename}" in text_of(app, "#question")
        await click(app, pilot, "#yes")
        await eventually(lambda: isinstance(app.screen, Running))
        await eventually(lambda: f"added model {SMOLLM2}" in text_of(app, "#result"), timeout_s=30)
        assert "uploading" in "\n".join(app.screen.query_one("#progress", Log).lines)
    (model,) = admin_client.models()
    assert model.name == SMOLLM2 and model.definition is not None
    (blob,) = admin_client.blobs()
    assert (model.definition.source.sha256, blob.filename) == (blob.sha256, PRESETS[SMOLLM2].filename)


async def test_models_are_added_from_a_gguf_and_its_projector_and_from_a_definition_file(
    admin_client: AdminClient, tmp_path: Path
) -> None:
    gguf, projector, folder = tmp_path / "vision.gguf", tmp_path / "mmproj-vision.gguf", tmp_path / "repo"
    gguf.write_bytes(b"GGUF weights")
    projector.write_bytes(b"GGUF projector")
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"tensors")
    written = tmp_path / "chat.json"
    app = ConsoleApp(AdminSource(admin_client, poll_s=0.2), now=lambda: NOW)
    async with app.run_test(size=SIZE) as pilot:

        async def dialog() -> None:
            await choose(app, pilot, "add-model")
            await eventually(lambda: isinstance(app.screen, AddModelDialog) and app.screen.query("#path"))

        await dialog()
        app.screen.query_one("#path", Input).value = str(folder)
        await click(app, pilot, "#ok")
        await eventually(lambda: "holds no config.json" in text_of(app, "#problem"), message="serve's check")

        app.screen.query_one("#path", Input).value = str(gguf)
        app.screen.query_one("#projector", Input).value = str(projector)
        await click(app, pilot, "#ok")
        await eventually(lambda: "added model vision" in app.notice.text, timeout_s=20)
        (vision,) = admin_client.models()
        assert vision.definition is not None
        written.write_text(json.dumps(vision.definition.model_dump(mode="json") | {"name": "ignored"}))

        await dialog()
        app.screen.query_one("#definition", Input).value = str(written)
        app.screen.query_one("#name", Input).value = "vision2"
        await click(app, pilot, "#ok")
        await eventually(lambda: "added model vision2" in app.notice.text)
    models = {m.name: m.definition.source for m in admin_client.models() if m.definition is not None}
    source = models["vision"]
    blobs = {b.filename: b.sha256 for b in admin_client.blobs()}
    assert source.sha256 == blobs["vision.gguf"] and source.projector is not None
    assert source.projector.sha256 == blobs["mmproj-vision.gguf"]
    assert models["vision2"] == source


def test_the_operations_load_nothing_of_the_command_line() -> None:
    """The console runs what the commands run from the layers below both, not from the commands."""
    code = (
        "import sys, llmgw.console.operations\n"
        "print(sorted(m for m in sys.modules if m == 'llmgw.cli' or m.startswith('llmgw.cli.')))"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert loaded.stdout.strip() == "[]"
