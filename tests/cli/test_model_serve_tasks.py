"""``model serve --serves`` and ``--pooling`` against a real admin API."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from llmgw.cli.main import app
from llmgw.client.admin import AdminClient

from .conftest import AdminServer


def serve(server: AdminServer, *args: str) -> tuple[int, str]:
    answer = CliRunner().invoke(app, ["model", "serve", *args, *server.options()], env={"COLUMNS": "200"})
    return answer.exit_code, f"{answer.output}{answer.exception or ''}"


def test_a_model_served_for_embeddings_says_so_in_its_profile(
    admin_server: AdminServer, tmp_path: Path
) -> None:
    weights = tmp_path / "embed.gguf"
    weights.write_bytes(b"GGUF" + b"\0" * 64)
    code, output = serve(admin_server, str(weights), "--serves", "embeddings", "--pooling", "mean")
    assert code == 0, output
    profile = AdminClient(admin_server.url, admin_server.token).model("embed").definition.profile
    assert (profile.serves, profile.pooling) == ("embeddings", "mean")


def test_pooling_for_a_chat_model_is_refused_naming_what_to_set(
    admin_server: AdminServer, tmp_path: Path
) -> None:
    weights = tmp_path / "chat.gguf"
    weights.write_bytes(b"GGUF" + b"\0" * 64)
    code, output = serve(admin_server, str(weights), "--pooling", "mean")
    assert code != 0 and "serves: embeddings" in output
