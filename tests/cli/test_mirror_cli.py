"""llmgw mirror (and ctl mirror): each blob's copies listed, and what a new control plane will pull."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from pathlib import Path

from typer.testing import CliRunner

from llmgw.adminapi.schemas import BlobCopyView, BlobView
from llmgw.cli.main import app
from llmgw.cli.mirror import copies_of
from llmgw.cli.output import console, shown
from llmgw.client.admin import AdminClient
from llmgw.errors import Conflict, NotFound
from llmgw.pki.authority import Authority
from llmgw.provisioning.clusters import certificate_warning, describe_pull, pull_estimate
from llmgw.store.database import Store

from .conftest import AdminServer

NOW = datetime(2026, 11, 30, tzinfo=UTC)


def test_a_listing_names_the_planes_holding_each_blob() -> None:
    copies = [BlobCopyView(plane=p, address=f"{p}:8443", copied_at=NOW) for p in ("cp1", "cp2")]
    held = BlobView(sha256="ab" * 32, size=3, filename="m.gguf", kind="weights", copies=copies)
    assert copies_of(held) == "cp1, cp2"
    assert copies_of(held.model_copy(update={"copies": []})) == "none yet"


def test_ctl_mirror_lists_what_llmgw_mirror_lists(admin_server: AdminServer, tmp_path: Path) -> None:
    weights = tmp_path / "m.gguf"
    weights.write_bytes(b"GGUF weights")
    runner = CliRunner()
    imported = runner.invoke(app, ["ctl", "mirror", "import", str(weights), *admin_server.options()])
    assert imported.exit_code == 0, imported.output
    listed = runner.invoke(app, ["mirror", "list", *admin_server.options()], env={"COLUMNS": "200"})
    assert "COPIES" in listed.output and "m.gguf" in listed.output


def test_server_add_says_how_much_the_new_plane_will_pull(tmp_path: Path) -> None:
    url = f"sqlite+aiosqlite:///{tmp_path / 'llmgw.db'}"

    async def fill() -> None:
        store = await Store.open(url)
        await store.blobs.add("ab" * 32, 1000, "a.gguf", "weights")
        await store.blobs.add("cd" * 32, 24, "b.gguf", "weights")
        await store.close()

    asyncio.run(fill())
    assert pull_estimate(url) == (2, 1024)
    assert describe_pull(url).startswith("it will pull 2 blobs (1024 bytes, 0.0 GiB) from its peers")


def test_server_add_says_so_when_the_store_cannot_be_read() -> None:
    said = describe_pull("postgresql+asyncpg://llmgw@127.0.0.1:1/llmgw", timeout_s=2)  # nothing listens
    assert said.startswith("cannot tell what it will pull from its peers yet")


def test_a_control_plane_certificate_with_both_uses_draws_no_warning(tmp_path: Path) -> None:
    authority = Authority.create(tmp_path / "ca")
    cert, _ = authority.issue("cp1", sans=["cp1"], usage="both", directory=tmp_path / "cp1", stem="server")
    assert certificate_warning("cp1", cert) == ""


def test_a_server_only_certificate_is_said_to_be_refused_by_the_mirrors(tmp_path: Path) -> None:
    authority = Authority.create(tmp_path / "ca")
    cert, _ = authority.issue("cp1", sans=["cp1"], usage="server", directory=tmp_path / "cp1", stem="server")
    warning = certificate_warning("cp1", cert)
    assert (
        "lacks client use" in warning and "mirrors would refuse it" in warning and "issue it again" in warning
    )


def test_ctl_mirror_ls_shows_owners_and_use_and_rm_removes_a_blob(
    admin_server: AdminServer, tmp_path: Path
) -> None:
    weights = tmp_path / "m.gguf"
    weights.write_bytes(b"GGUF weights")
    runner = CliRunner()
    env = {"COLUMNS": "220"}
    imported = runner.invoke(app, ["ctl", "mirror", "import", str(weights), *admin_server.options()])
    assert imported.exit_code == 0, imported.output
    sha = imported.output.strip().splitlines()[-1].removeprefix("sha256:")
    listed = runner.invoke(app, ["ctl", "mirror", "ls", *admin_server.options()], env=env)
    assert listed.exit_code == 0, listed.output
    assert "OWNER" in listed.output and "admin" in listed.output
    assert "admin holds 12 bytes in the mirror (no quota); largest upload 274877906944 bytes" in listed.output
    removed = runner.invoke(app, ["ctl", "mirror", "rm", sha, "--json", *admin_server.options()])
    assert removed.exit_code == 0, removed.output
    assert json.loads(removed.output)["sha256"] == sha
    assert (
        json.loads(runner.invoke(app, ["ctl", "mirror", "ls", "--json", *admin_server.options()]).output)
        == []
    )
    again = runner.invoke(app, ["ctl", "mirror", "rm", sha, *admin_server.options()])
    assert isinstance(again.exception, NotFound) and "no file with sha256" in str(again.exception)
    audit = runner.invoke(app, ["ctl", "audit", "--json", *admin_server.options()])
    assert [e["action"] for e in json.loads(audit.output)][:2] == ["mirror.remove", "mirror.import"]


def test_ctl_mirror_rm_refuses_a_blob_a_model_names_saying_which(
    admin_server: AdminServer, tmp_path: Path
) -> None:
    weights = tmp_path / "m.gguf"
    weights.write_bytes(b"GGUF weights")
    runner = CliRunner()
    imported = runner.invoke(app, ["ctl", "mirror", "import", str(weights), *admin_server.options()])
    sha = imported.output.strip().splitlines()[-1].removeprefix("sha256:")
    client = AdminClient(admin_server.url, admin_server.token)
    client.add_model({"name": "chat", "source": {"sha256": sha}})
    refused = runner.invoke(app, ["ctl", "mirror", "rm", sha, *admin_server.options()])
    assert isinstance(refused.exception, Conflict)
    assert "in use by model chat" in refused.exception.message and refused.exception.hint
    assert [b.sha256 for b in client.blobs()] == [sha]


def test_ctl_mirror_rm_help_says_who_may_remove_what() -> None:
    helped = CliRunner().invoke(app, ["ctl", "mirror", "rm", "--help"], env={"COLUMNS": "200"})
    assert helped.exit_code == 0
    assert "--json" in helped.output and "cluster admin" in helped.output


async def _audit_with(folder: Path, target: str) -> None:
    store = await Store.open(f"sqlite+aiosqlite:///{folder / 'llmgw.db'}")
    await store.audit.record("mia", "knowledge.upload", target)
    await store.close()


def test_ctl_audit_prints_control_characters_escaped(admin_server: AdminServer, tmp_path: Path) -> None:
    client = AdminClient(admin_server.url, admin_server.token)
    asyncio.run(_audit_with(tmp_path, "guide/evil\x1b[2J\x07.md"))  # kept before names were checked
    audit = CliRunner().invoke(app, ["ctl", "audit", *admin_server.options()], env={"COLUMNS": "200"})
    assert audit.exit_code == 0, audit.output
    assert "\x1b" not in audit.output and "\x07" not in audit.output
    assert "evil\\x1b[2J\\x07.md" in audit.output
    assert client.audit(5)[0].target == "guide/evil\x1b[2J\x07.md"


def test_a_client_given_name_prints_as_text_with_control_characters_escaped() -> None:
    with console.capture() as captured:
        console.print(shown("[bold]evil[/]\x1b[2J.gguf"))
    assert captured.get().strip() == "[bold]evil[/]\\x1b[2J.gguf"
