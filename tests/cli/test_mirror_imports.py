"""``mirror import-hf``, ``import-ollama``, ``pull`` and ``model serve hf:`` against a real admin API."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from llmgw.cli.main import app
from llmgw.client.admin import AdminClient
from llmgw.testing.hf_hub_standin import FakeHfHub, small_repo, write_hub_cache
from llmgw.testing.ollama_registry_standin import (
    MODEL_MEDIA_TYPE,
    PROJECTOR_MEDIA_TYPE,
    small_model,
    write_models_folder,
)

from .conftest import AdminServer

SHARD = "model-00001-of-00002.safetensors"


def run(server: AdminServer, *args: str, code: int = 0) -> Any:
    answer = CliRunner().invoke(app, [*args, *server.options()], env={"COLUMNS": "200", "HF_TOKEN": ""})
    assert answer.exit_code == code, f"{answer.output}{answer.exception!r}"
    if code:
        return f"{answer.output}{answer.exception}"
    return json.loads(answer.stdout) if "--json" in args else answer.output


def test_import_hf_from_the_hub_cache_checks_each_file_and_prints_its_source(
    admin_server: AdminServer, tmp_path: Path
) -> None:
    repo = small_repo()
    entry = write_hub_cache(tmp_path / "hub", "org/tiny", repo)
    answer = run(admin_server, "mirror", "import-hf", str(entry), "--json")
    checks = {f["filename"]: f["checked_by"] for f in answer["files"]}
    assert checks[SHARD] == "sha256 (hub)" and checks["config.json"] == "git sha1 (hub)"
    assert answer["catalog_source"]["filename"] == SHARD
    assert answer["catalog_source"]["sha256"] == hashlib.sha256(repo.files[SHARD]).hexdigest()
    held = {b.filename for b in AdminClient(admin_server.url, admin_server.token).blobs()}
    assert {SHARD, "config.json", "tokenizer.json"} <= held


def test_import_hf_refuses_a_damaged_cache_file_by_name_before_uploading_it(
    admin_server: AdminServer, tmp_path: Path
) -> None:
    repo = small_repo()
    entry = write_hub_cache(tmp_path / "hub", "org/tiny", repo)
    blob = entry / "blobs" / hashlib.sha256(repo.files[SHARD]).hexdigest()
    blob.write_bytes(b"damaged")
    output = run(admin_server, "mirror", "import-hf", str(entry), code=1)
    assert SHARD in output and "hub named it sha256" in output
    held = {b.filename for b in AdminClient(admin_server.url, admin_server.token).blobs()}
    assert SHARD not in held


def test_import_hf_of_a_plain_folder_says_no_hub_checksum_was_available(
    admin_server: AdminServer, tmp_path: Path
) -> None:
    for name, data in small_repo().files.items():
        (tmp_path / "snap" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "snap" / name).write_bytes(data)
    answer = run(admin_server, "mirror", "import-hf", str(tmp_path / "snap"), "--json")
    assert {f["checked_by"] for f in answer["files"]} == {"none: no hub checksum was available"}


def test_import_ollama_lists_then_imports_weights_and_projector(
    admin_server: AdminServer, tmp_path: Path
) -> None:
    model = small_model("seer", projector=True)
    folder = write_models_folder(tmp_path / "ollama", "seer", "7b", model)
    assert run(admin_server, "mirror", "import-ollama", "--models", str(folder), "--json") == ["seer:7b"]
    answer = run(admin_server, "mirror", "import-ollama", "seer:7b", "--models", str(folder), "--json")
    source = answer["catalog_source"]
    assert source["sha256"] == model.sha256_of(MODEL_MEDIA_TYPE)
    assert source["projector"]["sha256"] == model.sha256_of(PROJECTOR_MEDIA_TYPE)
    held = {b.sha256: b.filename for b in AdminClient(admin_server.url, admin_server.token).blobs()}
    assert held[source["sha256"]] == "seer-7b.gguf"


def test_import_ollama_refuses_a_damaged_blob_by_name(admin_server: AdminServer, tmp_path: Path) -> None:
    model = small_model()
    model.corrupt.add(model.sha256_of(MODEL_MEDIA_TYPE))
    folder = write_models_folder(tmp_path / "ollama", "tiny", "latest", model)
    output = run(admin_server, "mirror", "import-ollama", "tiny", "--models", str(folder), code=1)
    assert "tiny-latest.gguf" in output and "Ollama named it" in output


def test_pull_and_model_serve_hf_add_a_model_with_the_pulled_source(admin_server: AdminServer) -> None:
    with FakeHfHub({"org/tiny": small_repo()}) as hub:
        admin = AdminClient(admin_server.url, admin_server.token)
        admin.set_setting("mirror.hf_endpoint", hub.url)
        pulled = run(admin_server, "mirror", "pull", "hf:org/tiny", "--json")
        assert pulled["state"] == "done" and pulled["catalog_source"]["filename"] == SHARD
        shown = run(admin_server, "mirror", "pull", "hf:org/tiny")
        assert "git sha1 (registry)" in shown and f'"filename": "{SHARD}"' in shown
        run(admin_server, "model", "serve", "hf:org/tiny", "--gpu-class", "h100", "--tp", "2")
    added = admin.model("tiny").definition
    assert added.source.sha256 == pulled["catalog_source"]["sha256"]
    assert [f.filename for f in added.source.files] == [
        f["filename"] for f in pulled["catalog_source"]["files"]
    ]
    assert (added.profile.engine, added.profile.tp) == ("vllm", 2)
