"""The Do menu: a key created through a real admin API, stop and start, a model from the mirror."""

from __future__ import annotations

from typing import Any

from textual.widgets import Input, OptionList, Select, Static

from llmgw.adminapi.schemas import ModelEntry
from llmgw.client.admin import AdminClient
from llmgw.console.app import ConsoleApp
from llmgw.console.dialogs import AddKeyDialog, AddModelDialog, Message
from llmgw.console.source import AdminSource
from llmgw.testing.eventually import eventually

from .fixtures import NOW, SHA, FixedSource

SIZE = (160, 40)


async def test_the_add_key_dialog_creates_a_key_through_the_admin_api(admin_client: AdminClient) -> None:
    app = ConsoleApp(AdminSource(admin_client, poll_s=0.2), now=lambda: NOW)
    async with app.run_test(size=SIZE) as pilot:
        await eventually(
            lambda: app.notice.text.startswith("live: events"), message="the event stream is read"
        )
        await pilot.press("d")
        await eventually(lambda: app.screen.query(OptionList), message="the Do menu opens")
        menu = app.screen.query_one(OptionList)
        menu.highlighted = menu.get_option_index("create-key")
        await pilot.press("enter")
        await eventually(
            lambda: isinstance(app.screen, AddKeyDialog) and app.screen.query("#name"),
            message="the add-key dialog opens",
        )
        app.screen.query_one("#name", Input).value = "chat-app"
        app.screen.query_one("#owner", Input).value = "web team"
        await pilot.pause()
        await pilot.click("#ok")
        await eventually(lambda: isinstance(app.screen, Message), message="the secret is shown")
        shown = str(app.screen.query_one("#message", Static).render())
        await pilot.press("escape")
        await pilot.press("8")
        await eventually(
            lambda: [k.name for k in app.data.keys] == ["chat-app"], message="the keys view has it"
        )
    keys = admin_client.keys()
    assert [(k.name, k.owner) for k in keys] == [("chat-app", "web team")]
    assert keys[0].prefix in shown and "shown this once" in shown


async def test_a_refused_key_is_said_in_the_dialog_which_stays_open(admin_client: AdminClient) -> None:
    app = ConsoleApp(AdminSource(admin_client, poll_s=0.2), now=lambda: NOW)
    async with app.run_test(size=SIZE) as pilot:
        app.push_screen(AddKeyDialog(app.source.create_key))
        await eventually(lambda: isinstance(app.screen, AddKeyDialog) and app.screen.query("#name"))
        app.screen.query_one("#name", Input).value = "x"
        app.screen.query_one("#place", Input).value = "nowhere"
        await pilot.pause()
        await pilot.click("#ok")
        problem = app.screen.query_one("#problem", Static)
        await eventually(lambda: "place" in str(problem.render()), message="the refusal names the field")
        assert isinstance(app.screen, AddKeyDialog)
    assert admin_client.keys() == []


async def test_stop_asks_first_then_stops_the_cluster_and_the_overview_says_so() -> None:
    source = FixedSource()
    app = ConsoleApp(source, now=lambda: NOW)
    async with app.run_test(size=SIZE) as pilot:
        await eventually(lambda: app.data.keys)
        await pilot.press("d")
        await eventually(lambda: app.screen.query(OptionList))
        menu = app.screen.query_one(OptionList)
        menu.highlighted = menu.get_option_index("stop")
        await pilot.press("enter")
        await eventually(lambda: app.screen.query("#yes"))
        await pilot.pause()
        await pilot.click("#yes")
        await eventually(lambda: source.serving == [True], message="the cluster was asked to stop")
        await eventually(lambda: app.data.stopped)


async def test_a_model_is_added_from_a_gguf_in_the_mirror() -> None:
    added: list[dict[str, Any]] = []

    class Recording(FixedSource):
        async def add_model(self, definition: dict[str, Any]) -> ModelEntry:
            added.append(definition)
            return await super().add_model(definition)

    app = ConsoleApp(Recording(), now=lambda: NOW)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("d")
        await eventually(lambda: app.screen.query(OptionList))
        await pilot.press("enter")  # the first action: add a model from the mirror
        await eventually(lambda: isinstance(app.screen, AddModelDialog) and app.screen.query("#name"))
        app.screen.query_one("#name", Input).value = "chat2"
        app.screen.query_one("#weights", Select).value = SHA
        app.screen.query_one("#replicas", Input).value = "2"
        await pilot.pause()
        await pilot.click("#ok")
        await eventually(lambda: "added model chat2" in app.notice.text)
    assert added == [
        {
            "name": "chat2",
            "source": {"sha256": SHA, "filename": "chat.gguf", "size": 94 << 20},
            "profile": {"ctx_size": 2048},
            "replicas": {"min": 2, "max": 2},
        }
    ]
