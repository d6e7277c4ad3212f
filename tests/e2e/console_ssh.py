"""The console's add-node and add-control-plane entries driven as a user does (textual's pilot), for the
SSH tests that set up a machine with the commands first."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
from textual.widgets import Checkbox, Input, Log, OptionList, Static

from llmgw.client.admin import AdminClient
from llmgw.console.app import ConsoleApp
from llmgw.console.dialogs import Confirm, Running
from llmgw.console.operations import Ssh
from llmgw.console.source import AdminSource
from llmgw.testing.eventually import eventually


@dataclass
class Ran:
    question: str
    progress: list[str]
    result: str
    nodes: list[str]
    """The connected nodes the console lists once the operation ended."""
    control_planes: list[str]
    """The control planes its overview lists then."""


def no_context(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The console finds the cluster by the server.yaml given, as the commands' tests do (no LLMGW_ URL,
    token or context of this machine's)."""
    for name in ("LLMGW_URL", "LLMGW_ADMIN_TOKEN", "LLMGW_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("LLMGW_CLIENT_CONFIG", str(tmp_path / "no-client-config.yaml"))


async def run_in_console(
    admin: AdminClient, action: str, fields: dict[str, str | bool], *, root: Path, timeout_s: float = 120
) -> Ran:
    """Open ``action`` from the Do menu, fill ``fields`` (inputs and checkboxes by id), say yes, and wait
    for the result; ``root``: where llmgw goes on the machine (``--root``, hidden, as in the commands)."""
    app = ConsoleApp(AdminSource(admin, poll_s=0.5), ssh=Ssh(root=str(root)))
    async with app.run_test(size=(160, 48)) as pilot:
        await pilot.press("d")
        await eventually(lambda: app.screen.query("#do-actions"), message="the Do menu opens")
        menu = app.screen.query_one(OptionList)
        menu.highlighted = menu.get_option_index(action)
        await pilot.press("enter")
        await eventually(lambda: app.screen.query("#host"), message=f"the {action} form opens")
        for name, value in fields.items():
            if isinstance(value, bool):
                app.screen.query_one(f"#{name}", Checkbox).value = value
            else:
                app.screen.query_one(f"#{name}", Input).value = value
        await pilot.pause()
        app.screen.query_one("#ok").scroll_visible(animate=False)
        await pilot.pause()
        await pilot.click("#ok")
        form = app.screen
        try:
            await eventually(lambda: isinstance(app.screen, Confirm), timeout_s=30, message="the question")
        except AssertionError as error:
            raise AssertionError(
                f"{error}; the form says: {form.query_one('#problem', Static).render()}"
            ) from None
        question = str(app.screen.query_one("#question", Static).render())
        await pilot.click("#yes")
        await eventually(lambda: isinstance(app.screen, Running), message=f"{action} runs")
        result = app.screen.query_one("#result", Static)
        await eventually(lambda: str(result.render()) != "running…", timeout_s=timeout_s, message="its end")
        progress = list(app.screen.query_one("#progress", Log).lines)
        ended = str(result.render())
        app.screen.query_one("#close").scroll_visible(animate=False)
        await pilot.pause()
        await pilot.click("#close")
        await eventually(lambda: not isinstance(app.screen, Running), message="the result closes")
        await eventually(lambda: app.data.status, message="the cluster's status is shown")
        assert app.data.status is not None
        planes = [plane.name for plane in app.data.status.control_planes]
        return Ran(question, progress, ended, [n.id for n in app.data.nodes if n.connected], planes)
