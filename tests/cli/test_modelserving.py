"""``llmgw model serve``: the definition it makes from a path and flags, checked before any upload."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmgw.client.definitions import definition
from llmgw.errors import ValidationFailed


def repository(folder: Path) -> Path:
    folder.mkdir()
    for name in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors", "config.json",
                 "tokenizer.json"):  # fmt: skip
        (folder / name).write_text("x")
    return folder


def serve(path: Path, **changes: object) -> tuple[dict[str, object], list[Path]]:
    options: dict[str, object] = {
        "name": None, "fmt": None, "engine": None, "projector": None,
        "profile": {"tp": 1}, "replicas": {"min": 1, "max": 1}, "on_demand": False,
    }  # fmt: skip
    return definition(path, **(options | changes))  # type: ignore[arg-type]


def test_a_safetensors_folder_runs_on_vllm_with_tp_and_gpu_class(tmp_path: Path) -> None:
    folder = repository(tmp_path / "Qwen3-8B")
    data, uploads = serve(folder, fmt="safetensors", profile={"tp": 2, "gpu_class": "h100"})
    assert data["name"] == "Qwen3-8B"
    assert data["profile"] == {"engine": "vllm", "tp": 2, "gpu_class": "h100"}
    source = data["source"]
    assert source["format"] == "safetensors"  # type: ignore[index]
    assert source["filename"] == "model-00001-of-00002.safetensors"  # type: ignore[index]
    assert [f["filename"] for f in source["files"]] == [  # type: ignore[index]
        "config.json",
        "model-00002-of-00002.safetensors",
        "tokenizer.json",
    ]
    assert uploads[0].name == "model-00001-of-00002.safetensors" and len(uploads) == 4


def test_a_gguf_with_projector_runs_on_llamacpp(tmp_path: Path) -> None:
    gguf, mmproj = tmp_path / "gemma.gguf", tmp_path / "mmproj.gguf"
    gguf.write_text("x")
    mmproj.write_text("x")
    data, uploads = serve(gguf, projector=mmproj)
    assert data["profile"]["engine"] == "llama.cpp"  # type: ignore[index]
    assert data["source"]["projector"]["filename"] == "mmproj.gguf"  # type: ignore[index]
    assert uploads == [gguf, mmproj]


def test_a_refused_flag_stops_it_before_any_upload(tmp_path: Path) -> None:
    folder = repository(tmp_path / "m")
    with pytest.raises(ValidationFailed) as caught:
        serve(folder, profile={"args": ["--trust-remote-code"]})
    assert "--trust-remote-code" in dict(caught.value.problems)["profile.args"]


def test_a_folder_without_config_is_not_a_repository(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "w.safetensors").write_text("x")
    with pytest.raises(ValidationFailed) as caught:
        serve(folder)
    assert "config.json" in str(caught.value)


def test_tp_on_llamacpp_is_refused(tmp_path: Path) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_text("x")
    with pytest.raises(ValidationFailed, match="tp needs engine"):
        serve(gguf, profile={"tp": 2})


def peft_folder(folder: Path, rank: int = 16) -> Path:
    folder.mkdir()
    (folder / "adapter_model.safetensors").write_text("x")
    (folder / "adapter_config.json").write_text(f'{{"peft_type": "LORA", "r": {rank}}}')
    return folder


def test_a_peft_folder_becomes_an_adapter_with_its_rank_and_its_files_are_uploaded(tmp_path: Path) -> None:
    base = repository(tmp_path / "Qwen3-8B")
    sql = peft_folder(tmp_path / "sql-lora", rank=32)
    data, uploads = serve(base, profile={"max_loaded_adapters": 1}, adapters=(("qwen-sql", sql),))
    assert data["adapters"] == [
        {"name": "qwen-sql", "sha256": "0" * 64, "filename": "adapter_model.safetensors",
         "files": [{"sha256": "0" * 64, "filename": "adapter_config.json"}], "rank": 32}
    ]  # fmt: skip
    assert uploads[-2:] == [sql / "adapter_model.safetensors", sql / "adapter_config.json"]


def test_a_gguf_adapter_goes_with_a_gguf_model(tmp_path: Path) -> None:
    gguf, lora = tmp_path / "small.gguf", tmp_path / "tone.gguf"
    gguf.write_text("x")
    lora.write_text("x")
    data, uploads = serve(gguf, adapters=(("small-tone", lora),))
    assert data["adapters"] == [{"name": "small-tone", "sha256": "0" * 64, "filename": "tone.gguf"}]
    assert uploads == [gguf, lora]


def test_a_folder_that_is_no_peft_adapter_is_refused_before_any_upload(tmp_path: Path) -> None:
    base = repository(tmp_path / "m")
    with pytest.raises(ValidationFailed) as caught:
        serve(base, adapters=(("sql", repository(tmp_path / "not-an-adapter")),))
    assert "adapter_config.json" in dict(caught.value.problems)["--adapter"]


def test_a_gguf_adapter_on_vllm_is_refused_by_its_field(tmp_path: Path) -> None:
    base, lora = repository(tmp_path / "m"), tmp_path / "tone.gguf"
    lora.write_text("x")
    with pytest.raises(ValidationFailed) as caught:
        serve(base, adapters=(("tone", lora),))
    assert "engine llama.cpp" in dict(caught.value.problems)["adapters.0.filename"]
