"""Pulls through a real control plane process: from the fake hub and registry, with the real CLI."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from llmgw.testing.cluster import Cluster
from llmgw.testing.hf_hub_standin import FakeHfHub, small_repo
from llmgw.testing.ollama_registry_standin import (
    MODEL_MEDIA_TYPE,
    PROJECTOR_MEDIA_TYPE,
    FakeOllamaRegistry,
    small_model,
)
from llmgw.testing.servedfiles import offsets

HF_TOKEN = "hf_e2e_gated_token_0042"
SHARD = "model-00001-of-00002.safetensors"


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    home = tmp_path_factory.mktemp("pulls")
    with Cluster(home, home / "cache") as running:
        running.start_server()
        yield running


@pytest.fixture(scope="module")
def hub(plane: Cluster) -> Iterator[FakeHfHub]:
    gated = small_repo("gated", shard_bytes=2_000_000)
    gated.gated_token = HF_TOKEN
    broken = small_repo("broken")
    broken.corrupt.add(SHARD)
    with FakeHfHub({"org/gated": gated, "org/broken": broken}) as server:
        plane.admin.set_setting("mirror.hf_endpoint", server.url)
        yield server  # type: ignore[misc]


@pytest.fixture(scope="module")
def registry(plane: Cluster) -> Iterator[FakeOllamaRegistry]:
    with FakeOllamaRegistry({"library/seer:7b": small_model("seer", 1_000_000, projector=True)}) as server:
        plane.admin.set_setting("mirror.ollama_registry", server.url)
        yield server  # type: ignore[misc]


def cli(plane: Cluster, *args: str, hf_token: str = "") -> subprocess.CompletedProcess[str]:
    environment = {
        **os.environ,
        "HF_TOKEN": hf_token,
        "LLMGW_URL": plane.url,
        "LLMGW_ADMIN_TOKEN": plane.token,
    }
    return subprocess.run(
        [sys.executable, "-m", "llmgw.cli.main", *args],
        capture_output=True,
        text=True,
        env=environment,
        timeout=120,
        check=False,
    )


def pulled(plane: Cluster, source: str, hf_token: str = "") -> dict[str, Any]:
    answer = cli(plane, "mirror", "pull", source, "--json", hf_token=hf_token)
    assert answer.returncode == 0, answer.stderr
    result: dict[str, Any] = json.loads(answer.stdout)
    return result


def test_gated_hf_repo_is_pulled_with_the_token_resuming_a_cut_download(
    plane: Cluster, hub: FakeHfHub
) -> None:
    repo = hub.repos["org/gated"]
    hub.cuts.once[SHARD] = 600_000
    done = pulled(plane, "hf:org/gated", hf_token=HF_TOKEN)
    assert done["state"] == "done" and done["revision"] == repo.commit
    lfs = f"/lfs/{hashlib.sha256(repo.files[SHARD]).hexdigest()}"
    first, resumed = offsets(hub.seen, lfs)
    assert first == 0 and 0 < resumed <= 600_000
    held = {b.sha256: b.filename for b in plane.admin.blobs()}
    for file in done["files"]:
        assert held[file["sha256"]] == file["filename"]
        assert file["sha256"] == hashlib.sha256(repo.files[file["filename"]]).hexdigest()
    assert done["catalog_source"]["filename"] == SHARD
    assert HF_TOKEN not in plane.log("server").read_text()


def test_gated_hf_repo_without_a_token_is_refused_saying_how_to_pass_one(
    plane: Cluster, hub: FakeHfHub
) -> None:
    answer = cli(plane, "mirror", "pull", "hf:org/gated")
    assert answer.returncode != 0
    assert "GatedRepo" in answer.stderr and "--hf-token" in answer.stderr


def test_hf_file_with_a_wrong_checksum_is_refused_by_name(plane: Cluster, hub: FakeHfHub) -> None:
    answer = cli(plane, "mirror", "pull", "hf:org/broken")
    assert answer.returncode != 0
    assert SHARD in answer.stderr and "sha256" in answer.stderr
    expected = hashlib.sha256(hub.repos["org/broken"].files[SHARD]).hexdigest()
    assert expected not in {b.sha256 for b in plane.admin.blobs()}


def test_ollama_model_is_pulled_with_its_projector_resuming_a_cut_download(
    plane: Cluster, registry: FakeOllamaRegistry
) -> None:
    model = registry.models["library/seer:7b"]
    weights = model.sha256_of(MODEL_MEDIA_TYPE)
    registry.cuts.once[weights] = 400_000
    done = pulled(plane, "ollama:seer:7b")
    assert done["catalog_source"]["sha256"] == weights
    assert done["catalog_source"]["projector"]["sha256"] == model.sha256_of(PROJECTOR_MEDIA_TYPE)
    first, resumed = offsets(registry.seen, f"/v2/library/seer/blobs/sha256:{weights}")
    assert first == 0 and 0 < resumed <= 400_000
    added = cli(plane, "model", "serve", "ollama:seer:7b", "--name", "seer", "--min", "0", "--on-demand")
    assert added.returncode == 0, added.stderr
    assert plane.admin.model("seer").definition.source.sha256 == weights
