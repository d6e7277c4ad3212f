"""The Do menu and its dialogs: models, presets, keys, stopping and starting, restarting agents, and the
machines themselves (a node or a control plane over SSH, wiping this one).

A dialog that calls the control plane shows a refusal in place (what was
wrong and what to do), so the input can be fixed. The operations on machines
(:mod:`llmgw.console.operations`) go in three screens: their form, checked as
the command checks its flags; :class:`Confirm`, naming what will happen (for
a wipe, everything that goes, and the machine's name typed); :class:`Running`,
each step as it is done, then the result or the error with what to do.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any, Literal

from textual import on, work
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Checkbox, Input, Label, Log, OptionList, Select, Static
from textual.widgets.option_list import Option

from llmgw.adminapi.schemas import BlobView, KeyCreated, ModelEntry
from llmgw.console.operations import (
    NODE_METRICS_PORT,
    PRESETS,
    AdminClient,
    Prepared,
    Ssh,
    add_from_files,
    definition_file,
    prepare_control_plane,
    prepare_node,
    prepare_preset,
    prepare_wipe,
)
from llmgw.errors import LlmgwError, ValidationFailed


class _Box(VerticalScroll, can_focus=False):
    """A dialog's frame: it scrolls when its content is taller than the screen, and leaves the focus to
    the dialog's first input."""


ACTIONS: list[tuple[str, str]] = [
    ("add-model", "Add a model (weights in the mirror, files here, or a definition file)"),
    ("add-preset", "Add a model from a preset"),
    ("create-key", "Create a key"),
    ("stop", "Stop the cluster (no replicas, /v1 answers 503)"),
    ("start", "Start the cluster (serve again)"),
    ("restart-agents", "Restart every node's agent"),
    ("add-control-plane", "Add a control plane over SSH (llmgw server add HOST)"),
    ("add-node", "Add a node over SSH (llmgw node add HOST)"),
    ("wipe", "Wipe llmgw from this machine (llmgw wipe)"),
]
"""The Do menu: (id, what it does)."""


class DoMenu(ModalScreen[str | None]):
    """The actions on the cluster; answers the chosen action's id (None: none)."""

    BINDINGS = [("escape", "dismiss(None)", "Close")]

    def compose(self) -> ComposeResult:
        with _Box(classes="dialog") as box:
            box.border_title = "Do"
            yield OptionList(*(Option(text, id=action) for action, text in ACTIONS), id="do-actions")

    @on(OptionList.OptionSelected)
    def chosen(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(event.option.id)


class _Form(ModalScreen[Any]):
    """A dialog of inputs with OK and Cancel; ``submit`` checks them (and calls the control plane)."""

    BINDINGS = [("escape", "dismiss(None)", "Cancel")]
    heading = ""

    def compose(self) -> ComposeResult:
        with _Box(classes="dialog") as box:
            box.border_title = self.heading
            yield from self.fields()
            yield Static("", id="problem", classes="problem")
            with Horizontal(classes="buttons"):
                yield Button("OK", id="ok", variant="primary")
                yield Button("Cancel", id="cancel")

    def fields(self) -> ComposeResult:
        raise NotImplementedError

    def value(self, name: str) -> str:
        return self.query_one(f"#{name}", Input).value.strip()

    def number(self, name: str, default: int) -> int:
        """An integer field (its input takes digits only); empty: ``default``."""
        text = self.value(name)
        return int(text) if text.lstrip("-").isdigit() else default

    def checked(self, name: str) -> bool:
        return self.query_one(f"#{name}", Checkbox).value

    def say(self, text: str) -> None:
        self.query_one("#problem", Static).update(text)

    @on(Button.Pressed, "#cancel")
    def cancel(self) -> None:
        self.dismiss(None)

    @on(Button.Pressed, "#ok")
    @on(Input.Submitted)
    async def ok(self) -> None:
        try:
            self.dismiss(await self.submit())
        except LlmgwError as error:
            self.say(str(error))

    async def submit(self) -> Any:
        raise NotImplementedError


class AddKeyDialog(_Form):
    """Create a key; answers :class:`KeyCreated` (its secret shown once, after)."""

    heading = "Create a key"

    def __init__(self, create: Callable[[str, str, str], Awaitable[KeyCreated]]) -> None:
        super().__init__()
        self.create = create

    def fields(self) -> ComposeResult:
        yield Label("Name (what the key is for)")
        yield Input(id="name", placeholder="chat-app")
        yield Label("Owner (a label: who uses it)")
        yield Input(id="owner")
        yield Label("Place (project:ORG/TEAM/PROJECT or user:NAME; empty: public models only)")
        yield Input(id="place")

    async def submit(self) -> KeyCreated:
        if not self.value("name"):
            raise LlmgwError("the key needs a name", "type what it is for, e.g. chat-app")
        return await self.create(self.value("name"), self.value("owner"), self.value("place"))


class AddModelDialog(_Form):
    """Add a model, as ``llmgw model serve`` and ``ctl model add`` take one: a GGUF of the mirror, a GGUF
    file (with its projector) or a safetensors repository's folder on this machine (uploaded first), or
    a definition file; answers :class:`ModelEntry`."""

    heading = "Add a model"

    def __init__(
        self,
        blobs: list[BlobView],
        add: Callable[[dict[str, Any]], Awaitable[ModelEntry]],
        admin: AdminClient | None = None,
    ) -> None:
        super().__init__()
        self.blobs = {b.sha256: b for b in blobs if b.filename.endswith(".gguf")}
        self.add = add
        self.admin = admin

    def fields(self) -> ComposeResult:
        yield Label("Name clients ask for (from a path: the file's or folder's name unless given)")
        yield Input(id="name", placeholder="smollm2-135m-instruct")
        yield Label("Weights: a GGUF in the mirror ('llmgw mirror import FILE' adds one)")
        yield Select(
            [(b.filename, b.sha256) for b in self.blobs.values()], id="weights", prompt="choose a file"
        )
        with Horizontal(classes="row"):
            yield self._field("… or a path here: a GGUF, a safetensors folder", "path", "", "text")
            yield self._field("Projector (mmproj GGUF, with a GGUF path)", "projector", "", "text")
        with Horizontal(classes="row"):
            yield self._field("Engine (empty: by format)", "engine", "", "text")
            yield self._field("Card class (empty: any)", "gpu_class", "", "text")
            yield self._field("Context per request (tokens)", "ctx_size", "2048")
            yield self._field("Cards (tp)", "tp", "1")
            yield self._field("Replicas", "replicas", "1")
        yield Label("… or a definition file (YAML or JSON, as 'llmgw ctl model add --definition')")
        yield Input(id="definition", placeholder="model.yaml")

    def _field(
        self, label: str, name: str, value: str, kind: Literal["integer", "text"] = "integer"
    ) -> Vertical:
        return Vertical(Label(label), Input(value, id=name, type=kind), classes="field")

    def _profile(self) -> dict[str, Any]:
        profile: dict[str, Any] = {"ctx_size": self.number("ctx_size", 2048)}
        if self.number("tp", 1) != 1:
            profile["tp"] = self.number("tp", 1)
        if self.value("gpu_class"):
            profile["gpu_class"] = self.value("gpu_class")
        return profile

    async def submit(self) -> ModelEntry:
        if self.value("definition"):
            data = await asyncio.to_thread(definition_file, self.value("definition"), self.value("name"))
            return await self.add(data)
        count = self.number("replicas", 1)
        replicas = {"min": count, "max": max(count, 1)}
        if self.value("path"):
            return await self._from_files(replicas)
        if self.value("projector"):
            raise ValidationFailed(
                [("projector", "goes with a GGUF on this machine")],
                "give the GGUF's path too, or leave it out",
            )
        chosen = self.query_one("#weights", Select).value
        if not self.value("name"):
            raise LlmgwError("the model needs a name", "type the name clients will ask for")
        if not isinstance(chosen, str) or chosen not in self.blobs:
            raise LlmgwError("no weights chosen", "choose a GGUF of the mirror, or give a path here")
        blob = self.blobs[chosen]
        profile = self._profile() | ({"engine": self.value("engine")} if self.value("engine") else {})
        return await self.add(
            {
                "name": self.value("name"),
                "source": {"sha256": blob.sha256, "filename": blob.filename, "size": blob.size},
                "profile": profile,
                "replicas": replicas,
            }
        )

    async def _from_files(self, replicas: dict[str, int]) -> ModelEntry:
        if self.admin is None:
            raise LlmgwError("this console reaches no admin API to upload to", "use 'llmgw model serve PATH'")
        data, upload = await asyncio.to_thread(
            partial(
                add_from_files,
                self.admin,
                self.value("path"),
                name=self.value("name"),
                engine=self.value("engine"),
                projector=self.value("projector"),
                profile=self._profile(),
                replicas=replicas,
            )
        )
        self.query_one("#ok", Button).disabled = True
        try:
            self.say(f"uploading {data['source']['filename']} and what goes with it into the mirror…")
            await asyncio.to_thread(upload)
            self.say(f"adding {data['name']}…")
            return await self.add(data)
        finally:
            self.query_one("#ok", Button).disabled = False


class AddPresetDialog(_Form):
    """Add a preset (``llmgw ctl model add PRESET``); answers the :class:`Prepared` upload and add."""

    heading = "Add a model from a preset"

    def __init__(self, admin: AdminClient | None) -> None:
        super().__init__()
        self.admin = admin

    def fields(self) -> ComposeResult:
        yield Label("Preset")
        yield Select(
            [(f"{p.name}: {p.description}", p.name) for p in PRESETS.values()],
            id="preset",
            prompt="choose one",
        )
        yield Static("", id="needs", markup=False)
        yield Label("Weights already in the mirror (sha256; empty: from the preset's package)")
        yield Input(id="weights")

    @on(Select.Changed, "#preset")
    def show_needs(self, event: Select.Changed) -> None:
        chosen = PRESETS.get(str(event.value))
        self.query_one("#needs", Static).update(f"needs: {chosen.needs}" if chosen else "")

    async def submit(self) -> Prepared:
        chosen = self.query_one("#preset", Select).value
        if not isinstance(chosen, str):
            raise LlmgwError("no preset chosen", "choose one of the list")
        if self.admin is None:
            raise LlmgwError("this console reaches no admin API", f"use 'llmgw ctl model add {chosen}'")
        return await asyncio.to_thread(prepare_preset, self.admin, chosen, self.value("weights"))


class _SshForm(_Form):
    """The SSH and install options ``node add`` and ``server add`` share, with the cluster's server.yaml."""

    def __init__(self, ssh: Ssh) -> None:
        super().__init__()
        self.ssh = ssh

    def ssh_fields(self) -> ComposeResult:
        yield Label("The cluster's server.yaml (empty: $LLMGW_CONFIG, the 'up' home or /etc/llmgw)")
        yield Input(id="config")
        with Horizontal(classes="row"):
            yield self._field("SSH user", "user", self.ssh.user)
            yield self._field("SSH port", "port", str(self.ssh.port), "integer")
            yield self._field(
                "Seconds to wait for it to join", "timeout", f"{self.ssh.timeout_s:g}", "number"
            )
        yield Label("Private key to log in with (empty: ssh's own and its agent's)")
        yield Input(self.ssh.identity, id="identity")
        yield Label("known_hosts file (empty: ~/.ssh/known_hosts)")
        yield Input(self.ssh.known_hosts, id="known_hosts")
        yield Checkbox(
            "Record the host key of a machine not yet in known_hosts", self.ssh.accept_host_key, id="accept"
        )
        yield Label(
            "Signed release: its directory, its https address, or 'mirror' (empty: the mirror's newest)"
        )
        yield Input(self.ssh.release, id="release")
        yield Label("The Python on the machine that makes llmgw's venv")
        yield Input(self.ssh.python, id="python")
        yield Checkbox(
            "Take the dependencies from that Python's environment (no index)",
            self.ssh.installed_deps,
            id="installed_deps",
        )

    def _field(
        self, label: str, name: str, value: str, kind: Literal["integer", "number", "text"] = "text"
    ) -> Vertical:
        return Vertical(Label(label), Input(value, id=name, type=kind), classes="field")

    def checking(self) -> None:
        self.say("checking the cluster, the names and the release…")

    def options(self) -> Ssh:
        try:
            timeout = float(self.value("timeout") or self.ssh.timeout_s)
        except ValueError:
            raise ValidationFailed([("--timeout", "not a number of seconds")], "type e.g. 120") from None
        return Ssh(
            user=self.value("user") or self.ssh.user,
            port=self.number("port", self.ssh.port),
            identity=self.value("identity"),
            known_hosts=self.value("known_hosts"),
            accept_host_key=self.checked("accept"),
            release=self.value("release"),
            python=self.value("python") or self.ssh.python,
            installed_deps=self.checked("installed_deps"),
            root=self.ssh.root,
            timeout_s=timeout,
        )


class AddNodeDialog(_SshForm):
    """``llmgw node add HOST``; answers the :class:`Prepared` onboarding."""

    heading = "Add a node over SSH"

    def fields(self) -> ComposeResult:
        yield Label("Host (what ssh connects to)")
        yield Input(id="host", placeholder="gpu3.example")
        with Horizontal(classes="row"):
            yield self._field("Node id (empty: the host)", "name", "")
            yield self._field("Address control planes reach (empty: the host)", "address", "")
            yield self._field("Agent's metrics port", "metrics_port", str(NODE_METRICS_PORT), "integer")
        yield from self.ssh_fields()

    async def submit(self) -> Prepared:
        self.checking()
        return await asyncio.to_thread(
            prepare_node,
            self.value("config"),
            self.value("host"),
            self.options(),
            name=self.value("name"),
            address=self.value("address"),
            metrics_port=self.number("metrics_port", NODE_METRICS_PORT),
        )


class AddControlPlaneDialog(_SshForm):
    """``llmgw server add HOST`` (``--vip``: the floating address); answers the :class:`Prepared`
    onboarding."""

    heading = "Add a control plane over SSH"

    def fields(self) -> ComposeResult:
        yield Label("Host (what ssh connects to)")
        yield Input(id="host", placeholder="cp2.example")
        with Horizontal(classes="row"):
            yield self._field("Its name", "name", "")
            yield self._field("Its address (empty: the host)", "address", "")
            yield self._field("HTTP port (/v1, /api)", "http_port", "8080", "integer")
            yield self._field("Agent port", "agent_port", "8443", "integer")
        with Horizontal(classes="row"):
            yield self._field("Floating address keepalived keeps on the leader (empty: none)", "vip", "")
            yield self._field("Its network interface", "interface", "eth0")
        yield from self.ssh_fields()

    async def submit(self) -> Prepared:
        self.checking()
        return await asyncio.to_thread(
            prepare_control_plane,
            self.value("config"),
            self.value("host"),
            self.options(),
            name=self.value("name"),
            address=self.value("address"),
            http_port=self.number("http_port", 8080),
            agent_port=self.number("agent_port", 8443),
            vip=self.value("vip"),
            interface=self.value("interface") or "eth0",
        )


class WipeDialog(_Form):
    """``llmgw wipe``: what to take with llmgw; answers the :class:`Prepared` wipe (its question lists
    what goes)."""

    heading = "Wipe llmgw from this machine"

    def fields(self) -> ComposeResult:
        yield Static(
            "Removes llmgw from the machine this console runs on: units, engines, the nft table, "
            "configuration, state, the CA from the trust store, keepalived's configuration llmgw wrote, "
            "its users. The next screen lists what goes.",
        )
        yield Label("Root directory llmgw is under")
        yield Input("/", id="root")
        yield Checkbox("Also the weights (the mirror's and the node's)", id="models")
        yield Checkbox("Also the store (the SQLite database)", id="store")

    async def submit(self) -> Prepared:
        return await asyncio.to_thread(
            prepare_wipe, self.value("root"), models=self.checked("models"), store=self.checked("store")
        )


class Message(ModalScreen[None]):
    """Something to read (a key's secret, what an action did), closed with Enter or Escape."""

    BINDINGS = [("escape", "dismiss(None)", "Close"), ("enter", "dismiss(None)", "Close")]

    def __init__(self, heading: str, text: str) -> None:
        super().__init__()
        self.heading, self.text = heading, text

    def compose(self) -> ComposeResult:
        with _Box(classes="dialog") as box:
            box.border_title = self.heading
            yield Static(self.text, id="message")
            yield Button("Close", id="close", variant="primary")

    @on(Button.Pressed, "#close")
    def close(self) -> None:
        self.dismiss(None)


class Confirm(ModalScreen[bool]):
    """Yes or no to an action that changes the whole cluster or a machine; with ``typed``, what is typed
    (a machine's name) is checked first, a wrong one said in place."""

    BINDINGS = [("escape", "dismiss(False)", "No")]

    def __init__(self, question: str, typed: Callable[[str], None] | None = None) -> None:
        super().__init__()
        self.question = question
        self.typed = typed

    def compose(self) -> ComposeResult:
        with _Box(classes="dialog") as box:
            box.border_title = "Are you sure?"
            yield Static(self.question, id="question", markup=False)
            if self.typed is not None:
                yield Input(id="typed")
                yield Static("", id="problem", classes="problem")
            with Horizontal(classes="buttons"):
                yield Button("Yes", id="yes", variant="error")
                yield Button("No", id="no")

    @on(Button.Pressed)
    def answer(self, event: Button.Pressed) -> None:
        if event.button.id != "yes":
            self.dismiss(False)
            return
        self.yes()

    @on(Input.Submitted, "#typed")
    def yes(self) -> None:
        if self.typed is not None:
            try:
                self.typed(self.query_one("#typed", Input).value)
            except LlmgwError as error:
                self.query_one("#problem", Static).update(str(error))
                return
        self.dismiss(True)


class Running(ModalScreen[str]):
    """A :class:`Prepared` operation running: each step as it is done, then its result, or its error with
    what to do; answers the result ("" when it failed). It cannot be left while it runs."""

    def __init__(self, prepared: Prepared) -> None:
        super().__init__()
        self.prepared = prepared
        self.result = ""
        self.done = False

    def compose(self) -> ComposeResult:
        with _Box(classes="dialog") as box:
            box.border_title = self.prepared.title
            yield Log(id="progress", auto_scroll=True)
            yield Static("running…", id="result", markup=False)
            yield Button("Close", id="close", variant="primary", disabled=True)

    def on_mount(self) -> None:
        self.run_it()

    @work(thread=True, exit_on_error=False)
    def run_it(self) -> None:
        try:
            result = self.prepared.run(lambda line: self.app.call_from_thread(self.said, line))
        except (LlmgwError, OSError) as error:
            message, hint = getattr(error, "message", str(error)), getattr(error, "hint", "")
            text = f"failed: {message}" + (f"\nwhat to do: {hint}" if hint else "")
            self.app.call_from_thread(self.ended, text, "")
            return
        self.app.call_from_thread(self.ended, result, result)

    def said(self, line: str) -> None:
        self.query_one("#progress", Log).write_line(line)

    def ended(self, text: str, result: str) -> None:
        self.result, self.done = result, True
        shown = self.query_one("#result", Static)
        shown.update(text)
        shown.set_class(not result, "problem")
        self.query_one("#close", Button).disabled = False

    @on(Button.Pressed, "#close")
    def close(self) -> None:
        if self.done:
            self.dismiss(self.result)

    def key_escape(self) -> None:
        self.close()
