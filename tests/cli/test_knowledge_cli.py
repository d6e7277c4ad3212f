"""``llmgw ctl kb create|upload|list|search|delete`` through a real admin API (hashed stand-in embedder)."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmgw.cli.main import app
from llmgw.client.admin import AdminClient
from llmgw.testing.admin import admin_app
from llmgw.testing.pdfs import text_pdf
from llmgw.testing.serving import served_in_thread

from .conftest import TOKEN, AdminServer
from .test_tenancy_cli import run


@pytest.fixture
def kb_server(tmp_path: Path) -> Iterator[AdminServer]:
    with served_in_thread(lambda: admin_app(tmp_path, token=TOKEN)) as url:
        admin = AdminClient(url, TOKEN)
        blob = admin.upload_blob("e.gguf", io.BytesIO(b"GGUF"), 4)
        admin.add_model(
            {
                "name": "minilm",
                "source": {"sha256": blob.sha256},
                "profile": {"serves": "embeddings", "pooling": "mean"},
            }
        )
        yield AdminServer(url, TOKEN, None)  # type: ignore[arg-type]


def test_a_collection_is_created_filled_searched_and_deleted(kb_server: AdminServer, tmp_path: Path) -> None:
    guide = tmp_path / "guide.md"
    guide.write_text(
        "# Baking\n\nBread rises because yeast turns sugar into gas.\n\n# Sailing\n\nA sloop has one mast."
    )
    manual = tmp_path / "manual.pdf"
    manual.write_bytes(text_pdf([["The reactor is cooled by heavy water."]]))
    run(kb_server, "ctl", "kb", "create", "handbook", "--embedding-model", "minilm")
    out = run(kb_server, "ctl", "kb", "upload", "handbook", str(guide), str(manual))
    assert "guide.md: 2 passages (markdown)" in out and "manual.pdf: 1 passages (pdf)" in out
    listed = json.loads(run(kb_server, "ctl", "kb", "list", "--json"))
    assert [(c["name"], c["documents"], c["passages"]) for c in listed] == [("handbook", 2, 3)]
    assert "manual.pdf" in run(kb_server, "ctl", "kb", "list", "handbook")
    found = json.loads(run(kb_server, "ctl", "kb", "search", "handbook", "heavy water reactor", "--json"))
    assert found[0]["document"] == "manual.pdf"
    assert "sloop" in run(kb_server, "ctl", "kb", "search", "handbook", "sloop mast", "--mode", "keyword")
    run(kb_server, "ctl", "kb", "delete", "handbook", "--document", "guide.md")
    run(kb_server, "ctl", "kb", "delete", "handbook")
    assert json.loads(run(kb_server, "ctl", "kb", "list", "--json")) == []


def test_pairs_are_uploaded_and_a_refused_file_says_why(kb_server: AdminServer, tmp_path: Path) -> None:
    pairs = tmp_path / "qa.jsonl"
    pairs.write_text('{"question": "q", "answer": "a"}\n')
    docx = tmp_path / "notes.docx"
    docx.write_bytes(b"PK")
    run(kb_server, "ctl", "kb", "create", "handbook", "--embedding-model", "minilm")
    assert "1 pairs added" in run(kb_server, "ctl", "kb", "upload", "handbook", str(pairs), "--pairs")
    options = ["--url", kb_server.url, "--token", kb_server.token]
    refused = CliRunner().invoke(app, ["ctl", "kb", "upload", "handbook", str(docx), *options])
    assert "'notes.docx' is not a document llmgw reads" in str(refused.exception)


@pytest.mark.parametrize("command", [("ctl", "kb"), ("ctl", "kb", "create")])
def test_kb_says_llmgw_up_serves_no_embedding_model_and_how_to_serve_one(
    command: tuple[str, ...],
) -> None:
    answer = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "2000"})
    assert answer.exit_code == 0, answer.output
    shown = " ".join(answer.output.split())
    assert "llmgw up (make up) serves no embedding model" in shown
    assert "'make embedding-model'" in shown and "--serves embeddings" in shown
