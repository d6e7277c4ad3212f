"""Parsing what the registries and the disk say: names, listings, manifests, snapshots."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from llmgw.errors import ChecksumMismatch, NotFound, ValidationFailed
from llmgw.mirror import huggingface, ollama
from llmgw.testing.hf_hub_standin import git_sha1, small_repo, write_hub_cache
from llmgw.testing.ollama_registry_standin import small_model, write_models_folder


def test_hf_reference_defaults_to_main_and_keeps_a_revision() -> None:
    assert huggingface.parse_ref("hf:org/repo") == huggingface.RepoRef("org/repo", "main")
    assert huggingface.parse_ref("org/repo@v1.0") == huggingface.RepoRef("org/repo", "v1.0")


@pytest.mark.parametrize("text", ["hf:repo", "hf:a/b/c", "hf:org/repo@", "hf:org--x/repo", "hf:../etc"])
def test_hf_reference_that_is_no_repository_is_refused_with_the_form_to_use(text: str) -> None:
    with pytest.raises(ValidationFailed, match="is not a Hugging Face repository") as refused:
        huggingface.parse_ref(text)
    assert "hf:ORG/REPO" in refused.value.hint


def test_tree_entries_give_lfs_sha256_and_git_sha1_and_skip_folders() -> None:
    files = huggingface.parse_tree(
        [
            {"type": "directory", "oid": "a" * 40, "size": 0, "path": "original"},
            {"type": "file", "oid": "b" * 40, "size": 10, "path": "config.json"},
            {
                "type": "file",
                "oid": "c" * 40,
                "size": 134,
                "path": "model.safetensors",
                "lfs": {"oid": "D" * 64, "size": 5000, "pointerSize": 134},
            },
        ]
    )
    assert files == [
        huggingface.RemoteFile("config.json", 10, "b" * 40, None),
        huggingface.RemoteFile("model.safetensors", 5000, "c" * 40, "d" * 64),
    ]


def test_tree_entry_whose_lfs_oid_is_no_sha256_is_refused_naming_the_file() -> None:
    entry = {"type": "file", "oid": "c" * 40, "size": 1, "path": "w.safetensors", "lfs": {"oid": "xyz"}}
    with pytest.raises(ValidationFailed, match=r"w\.safetensors"):
        huggingface.parse_tree([entry])


def test_next_page_is_read_from_the_link_header() -> None:
    link = '<https://hub/api/models/a/b/tree/main?cursor=abc>; rel="next"'
    assert huggingface.next_page(link) == "https://hub/api/models/a/b/tree/main?cursor=abc"
    assert huggingface.next_page("") is None


def test_only_top_level_weights_config_and_tokenizer_are_kept() -> None:
    names = [p for p in small_repo().files if huggingface.kept(p)]
    assert sorted(names) == [
        "config.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]


def test_git_blob_sha1_is_what_git_names_the_file_by(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"hello\n")
    assert huggingface.git_blob_sha1(tmp_path / "f") == "ce013625030ba8dba906f756967f9e9ca394464a"


def test_hub_cache_files_carry_the_checksum_their_blob_is_named_by(tmp_path: Path) -> None:
    repo = small_repo()
    entry = write_hub_cache(tmp_path, "org/tiny", repo)
    files = {f.name: f for f in huggingface.local_files(entry)}
    weights = repo.files["model-00001-of-00002.safetensors"]
    assert files["model-00001-of-00002.safetensors"].sha256 == hashlib.sha256(weights).hexdigest()
    assert files["config.json"].git_sha1 == git_sha1(repo.files["config.json"])
    assert "README.md" not in files
    assert huggingface.check_local(files["config.json"]) == (
        hashlib.sha256(repo.files["config.json"]).hexdigest(),
        len(repo.files["config.json"]),
    )


def test_damaged_cache_blob_is_refused_naming_the_file(tmp_path: Path) -> None:
    entry = write_hub_cache(tmp_path, "org/tiny", small_repo())
    shard = next(f for f in huggingface.local_files(entry) if f.name.endswith("1-of-00002.safetensors"))
    shard.path.resolve().chmod(0o644)
    shard.path.resolve().write_bytes(b"not the weights")
    with pytest.raises(ChecksumMismatch, match=r"model-00001-of-00002\.safetensors"):
        huggingface.check_local(shard)


def test_plain_snapshot_folder_has_no_hub_checksum(tmp_path: Path) -> None:
    for name, data in small_repo().files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(data)
    files = huggingface.local_files(tmp_path)
    assert all(f.sha256 is None and f.git_sha1 is None for f in files)
    assert files[0].checked_by == "none: no hub checksum was available"


def test_folder_without_weights_and_config_is_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValidationFailed, match=r"no \.safetensors weights"):
        huggingface.local_files(tmp_path)


def test_safetensors_source_puts_the_first_shard_first() -> None:
    source = huggingface.safetensors_source(
        [("config.json", "a" * 64, 1), ("m-2.safetensors", "b" * 64, 2), ("m-1.safetensors", "c" * 64, 3)]
    )
    assert (source["filename"], source["sha256"], source["size"]) == ("m-1.safetensors", "c" * 64, 3)
    assert [f["filename"] for f in source["files"]] == ["config.json", "m-2.safetensors"]


def test_ollama_names_default_to_library_and_latest() -> None:
    assert ollama.parse_name("ollama:llama3.2") == ollama.ModelName("llama3.2", "latest", "library")
    assert ollama.parse_name("me/tiny:q4") == ollama.ModelName("tiny", "q4", "me")
    with pytest.raises(ValidationFailed, match="not an Ollama model name"):
        ollama.parse_name("ollama:a/b/c")


def test_manifest_gives_the_weights_and_projector_layers() -> None:
    model = small_model(projector=True)
    layers = ollama.parse_manifest(model.manifest(), ollama.ModelName("tiny"))
    assert layers.model.sha256 == model.sha256_of(ollama.MODEL_MEDIA_TYPE)
    assert layers.projector is not None
    assert layers.projector.sha256 == model.sha256_of(ollama.PROJECTOR_MEDIA_TYPE)


def test_manifest_without_weights_is_refused_saying_so() -> None:
    with pytest.raises(ValidationFailed, match="no GGUF weights"):
        ollama.parse_manifest({"layers": []}, ollama.ModelName("tiny"))


def test_models_folder_lists_its_models_and_checks_blobs(tmp_path: Path) -> None:
    model = small_model(projector=True)
    write_models_folder(tmp_path, "tiny", "latest", model)
    assert ollama.local_models(tmp_path) == [ollama.ModelName("tiny", "latest")]
    layers, weights, projector = ollama.local_layers(tmp_path, ollama.ModelName("tiny"))
    ollama.check_blob(weights, layers.model, "weights")
    assert projector is not None and layers.projector is not None
    ollama.check_blob(projector, layers.projector, "projector")


def test_damaged_ollama_blob_is_refused_naming_it(tmp_path: Path) -> None:
    model = small_model()
    model.corrupt.add(model.sha256_of(ollama.MODEL_MEDIA_TYPE))
    write_models_folder(tmp_path, "tiny", "latest", model)
    layers, weights, _ = ollama.local_layers(tmp_path, ollama.ModelName("tiny"))
    with pytest.raises(ChecksumMismatch, match=f"sha256-{layers.model.sha256}"):
        ollama.check_blob(weights, layers.model, "weights")


def test_unknown_local_model_names_those_present(tmp_path: Path) -> None:
    write_models_folder(tmp_path, "tiny", "latest", small_model())
    with pytest.raises(NotFound, match=r"present: tiny:latest"):
        ollama.local_layers(tmp_path, ollama.ModelName("other"))


def test_models_folder_follows_ollama_models() -> None:
    assert ollama.models_folder({"OLLAMA_MODELS": "/srv/ollama"}) == Path("/srv/ollama")
    assert ollama.models_folder({}) == Path("~/.ollama/models").expanduser()
