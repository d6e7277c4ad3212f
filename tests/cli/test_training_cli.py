"""``llmgw ctl train submit|status|list|logs|cancel|publish`` through a real admin API."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
from typer.testing import CliRunner

from llmgw.cli.main import app
from llmgw.errors import LlmgwError

from .conftest import AdminServer
from .test_tenancy_cli import run


def refused(server: AdminServer, *args: str) -> str:
    """The error a command that fails ends with (``llmgw``'s main prints it), with its hint."""
    answer = CliRunner().invoke(app, [*args, *server.options()], env={"COLUMNS": "200"})
    assert isinstance(answer.exception, LlmgwError), answer.output
    assert answer.exception.hint
    return answer.exception.message


def add_model(server: AdminServer) -> None:
    headers = {"Authorization": f"Bearer {server.token}"}
    files = []
    for name, data in (("model.safetensors", b"weights"), ("config.json", b'{"model_type": "llama"}')):
        answer = httpx.post(
            f"{server.url}/api/mirror/blobs", params={"filename": name}, content=data, headers=headers
        )
        files.append({"sha256": answer.json()["sha256"], "filename": name})
    source = {"format": "safetensors", **files[0], "files": files[1:]}
    model = {"name": "tiny", "source": source, "profiles": [{"engine": "vllm"}]}
    assert httpx.post(f"{server.url}/api/models", json=model, headers=headers).status_code == 201


def test_a_job_is_submitted_followed_and_cancelled(admin_server: AdminServer, tmp_path: Path) -> None:
    add_model(admin_server)
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text('{"question": "colour?", "answer": "blue"}\n')
    submitted = json.loads(
        run(
            admin_server,
            *("ctl", "train", "submit", "tiny", "--pairs", str(pairs), "--memory-mb", "2000"),
            *("--device", "cpu", "--steps", "5", "--target", "q_proj", "--json"),
        )
    )
    job_id = submitted["id"]
    assert (submitted["state"], submitted["options"]["steps"], submitted["options"]["target_modules"]) == (
        "queued",
        5,
        ["q_proj"],
    )
    shown = run(admin_server, "ctl", "train", "status", job_id)
    assert "queued" in shown and "2000 MiB on the cpu" in shown
    listed = json.loads(run(admin_server, "ctl", "train", "list", "--json"))
    assert [j["id"] for j in listed] == [job_id]
    assert job_id in run(admin_server, "ctl", "train", "list")
    assert run(admin_server, "ctl", "train", "logs", job_id) == ""
    assert "cancelled" in run(admin_server, "ctl", "train", "cancel", job_id)
    assert "is cancelled" in refused(admin_server, "ctl", "train", "publish", job_id, "--name", "x")


def test_bad_pairs_are_refused_naming_the_line(admin_server: AdminServer, tmp_path: Path) -> None:
    add_model(admin_server)
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text('{"question": "colour?"}\n')
    said = refused(admin_server, "ctl", "train", "submit", "tiny", "--pairs", str(pairs), "--memory-mb", "1")
    assert "pairs.line 1" in said and "answer is missing" in said
    said = refused(admin_server, "ctl", "train", "submit", "tiny", "--memory-mb", "1")
    assert "--pairs FILE or --pairs-from COLLECTION" in said
