"""Pull jobs against the fake hub and registry: checked, resumed, refused, and the catalog source."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from llmgw.core.catalog import parse_model
from llmgw.core.settingtypes import HF_ENDPOINT_SETTING, OLLAMA_REGISTRY_SETTING
from llmgw.mirror.blobs import BlobStore
from llmgw.mirror.pulling import Pulls
from llmgw.store.database import Store
from llmgw.testing.clock import FakeClock
from llmgw.testing.hf_hub_standin import FakeHfHub, small_repo
from llmgw.testing.ollama_registry_standin import (
    MODEL_MEDIA_TYPE,
    PROJECTOR_MEDIA_TYPE,
    FakeOllamaRegistry,
    small_model,
)
from llmgw.testing.servedfiles import offsets

TOKEN = "hf_secret_token_1234"
SHARD = "model-00001-of-00002.safetensors"


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[Store]:
    opened = await Store.open(
        f"sqlite+aiosqlite:///{tmp_path / 'store.db'}", timeout_s=5.0, clock=FakeClock()
    )
    try:
        yield opened
    finally:
        await opened.close()


@pytest.fixture
async def hub(store: Store) -> AsyncIterator[FakeHfHub]:
    repo = small_repo()
    gated = small_repo("gated")
    gated.gated_token = TOKEN
    async with FakeHfHub({"org/tiny": repo, "org/gated": gated}) as server:
        await store.settings.set(HF_ENDPOINT_SETTING, server.url, "tests")
        yield server  # type: ignore[misc]


@pytest.fixture
async def registry(store: Store) -> AsyncIterator[FakeOllamaRegistry]:
    models = {"library/tiny:latest": small_model(), "library/seer:7b": small_model("seer", projector=True)}
    async with FakeOllamaRegistry(models) as server:
        await store.settings.set(OLLAMA_REGISTRY_SETTING, server.url, "tests")
        yield server  # type: ignore[misc]


def pulls_of(store: Store, tmp_path: Path, **options: object) -> Pulls:
    return Pulls(BlobStore(tmp_path / "mirror"), store, clock=FakeClock(), backoff_s=0, **options)  # type: ignore[arg-type]


async def test_hf_pull_keeps_weights_config_and_tokenizer_checked_and_gives_the_source(
    hub: FakeHfHub, store: Store, tmp_path: Path
) -> None:
    pulls = pulls_of(store, tmp_path)
    pull = await pulls.wait(pulls.start("hf:org/tiny", "admin").id)
    assert pull.state == "done", pull.error
    repo = hub.repos["org/tiny"]
    assert pull.revision == repo.commit
    assert {f.filename for f in pull.files} == {
        "config.json",
        SHARD,
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
        "tokenizer.json",
        "tokenizer_config.json",
    }
    checks = {f.filename: f.checked_by for f in pull.files}
    assert checks[SHARD] == "sha256 (registry)"
    assert checks["config.json"] == "git sha1 (registry)"
    for file in pull.files:
        assert pulls.blobs.path_of(file.sha256).read_bytes() == repo.files[file.filename]
    assert pull.catalog_source is not None
    model = parse_model({"name": "tiny", "source": pull.catalog_source, "profile": {"engine": "vllm"}})
    assert model.source.filename == SHARD
    assert {b.filename for b in await store.blobs.list()} >= {SHARD, "config.json"}
    assert any("cursor=" in s.path or s.path.endswith("/tree/" + repo.commit) for s in hub.seen)


async def test_gated_repo_without_a_token_fails_saying_how_to_pass_one(
    hub: FakeHfHub, store: Store, tmp_path: Path
) -> None:
    pulls = pulls_of(store, tmp_path)
    pull = await pulls.wait(pulls.start("hf:org/gated", "admin").id)
    assert pull.state == "failed"
    assert "refused access" in pull.error and "GatedRepo" in pull.error
    assert "HF_TOKEN" in pull.hint


async def test_token_passed_for_the_pull_opens_a_gated_repo_and_is_shown_nowhere(
    hub: FakeHfHub, store: Store, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pulls = pulls_of(store, tmp_path)
    pull = await pulls.wait(pulls.start("hf:org/gated", "admin", TOKEN).id)
    assert pull.state == "done", pull.error
    assert TOKEN not in repr(pull) and TOKEN not in caplog.text
    entries = await store.audit.list()
    assert [e.action for e in entries] == ["mirror.pull"]
    assert TOKEN not in str(entries)


async def test_control_planes_hf_token_is_used_when_none_is_passed(
    hub: FakeHfHub, store: Store, tmp_path: Path
) -> None:
    pulls = pulls_of(store, tmp_path, environ={"HF_TOKEN": TOKEN})
    pull = await pulls.wait(pulls.start("hf:org/gated", "admin").id)
    assert pull.state == "done", pull.error


async def test_cut_download_is_resumed_with_a_range_request(
    hub: FakeHfHub, store: Store, tmp_path: Path
) -> None:
    hub.cuts.once[SHARD] = 70_000
    pulls = pulls_of(store, tmp_path)
    pull = await pulls.wait(pulls.start("hf:org/tiny", "admin").id)
    assert pull.state == "done", pull.error
    lfs = hashlib.sha256(hub.repos["org/tiny"].files[SHARD]).hexdigest()
    first, resumed = offsets(hub.seen, f"/lfs/{lfs}")
    assert first == 0 and 0 < resumed <= 70_000


async def test_partial_file_outlives_a_failed_pull_and_the_next_pull_resumes_it(
    hub: FakeHfHub, store: Store, tmp_path: Path
) -> None:
    hub.cuts.once[SHARD] = 50_000
    pulls = pulls_of(store, tmp_path, tries=1)
    failed = await pulls.wait(pulls.start("hf:org/tiny", "admin").id)
    assert failed.state == "failed"
    assert SHARD in failed.error and "resumes" in failed.hint
    again = await pulls.wait(pulls.start("hf:org/tiny", "admin").id)
    assert again.state == "done", again.error
    lfs = hashlib.sha256(hub.repos["org/tiny"].files[SHARD]).hexdigest()
    first, resumed = offsets(hub.seen, f"/lfs/{lfs}")
    assert first == 0 and 0 < resumed <= 50_000


async def test_file_whose_bytes_differ_from_the_hubs_sha256_is_refused_by_name(
    hub: FakeHfHub, store: Store, tmp_path: Path
) -> None:
    hub.repos["org/tiny"].corrupt.add(SHARD)
    pulls = pulls_of(store, tmp_path)
    pull = await pulls.wait(pulls.start("hf:org/tiny", "admin").id)
    assert pull.state == "failed"
    assert SHARD in pull.error and "sha256" in pull.error
    assert not list((pulls.blobs.root / "pulls").glob("*.partial"))
    expected = hashlib.sha256(hub.repos["org/tiny"].files[SHARD]).hexdigest()
    assert not pulls.blobs.has(expected)


async def test_file_kept_in_git_is_checked_by_its_git_sha1(
    hub: FakeHfHub, store: Store, tmp_path: Path
) -> None:
    hub.repos["org/tiny"].corrupt.add("config.json")
    pulls = pulls_of(store, tmp_path)
    pull = await pulls.wait(pulls.start("hf:org/tiny", "admin").id)
    assert pull.state == "failed"
    assert "config.json" in pull.error and "git sha1" in pull.error


async def test_unknown_repository_and_revision_say_so(hub: FakeHfHub, store: Store, tmp_path: Path) -> None:
    pulls = pulls_of(store, tmp_path)
    missing = await pulls.wait(pulls.start("hf:org/nothing", "admin").id)
    assert "has no repository org/nothing" in missing.error
    revision = await pulls.wait(pulls.start("hf:org/tiny@v9", "admin").id)
    assert "has no revision v9" in revision.error


async def test_ollama_pull_keeps_weights_and_projector_checked_and_gives_a_gguf_source(
    registry: FakeOllamaRegistry, store: Store, tmp_path: Path
) -> None:
    pulls = pulls_of(store, tmp_path)
    pull = await pulls.wait(pulls.start("ollama:seer:7b", "admin").id)
    assert pull.state == "done", pull.error
    model = registry.models["library/seer:7b"]
    assert pull.catalog_source is not None
    definition = parse_model({"name": "seer", "source": pull.catalog_source})
    assert definition.source.sha256 == model.sha256_of(MODEL_MEDIA_TYPE)
    assert definition.source.projector is not None
    assert definition.source.projector.sha256 == model.sha256_of(PROJECTOR_MEDIA_TYPE)
    assert pulls.blobs.path_of(definition.source.sha256).read_bytes() == model.layers[MODEL_MEDIA_TYPE]


async def test_ollama_cut_blob_resumes_and_damaged_blob_is_refused(
    registry: FakeOllamaRegistry, store: Store, tmp_path: Path
) -> None:
    model = registry.models["library/tiny:latest"]
    weights = model.sha256_of(MODEL_MEDIA_TYPE)
    registry.cuts.once[weights] = 100_000
    pulls = pulls_of(store, tmp_path)
    pull = await pulls.wait(pulls.start("ollama:tiny", "admin").id)
    assert pull.state == "done", pull.error
    first, resumed = offsets(registry.seen, f"/v2/library/tiny/blobs/sha256:{weights}")
    assert first == 0 and 0 < resumed <= 100_000
    model.corrupt.add(weights)
    pulls.blobs.path_of(weights).chmod(0o644)
    pulls.blobs.path_of(weights).unlink()
    damaged = await pulls.wait(pulls.start("ollama:tiny", "admin").id)
    assert damaged.state == "failed"
    assert "tiny-latest.gguf" in damaged.error and weights in damaged.error


async def test_unknown_ollama_tag_says_so(registry: FakeOllamaRegistry, store: Store, tmp_path: Path) -> None:
    pulls = pulls_of(store, tmp_path)
    pull = await pulls.wait(pulls.start("ollama:tiny:13b", "admin").id)
    assert pull.state == "failed" and "no such model or tag" in pull.error


async def test_a_second_start_of_a_running_pull_answers_the_same_job(
    hub: FakeHfHub, store: Store, tmp_path: Path
) -> None:
    pulls = pulls_of(store, tmp_path)
    first = pulls.start("hf:org/tiny", "admin")
    assert pulls.start("hf:org/tiny@main", "admin") is first
    await pulls.wait(first.id)


async def test_file_the_mirror_already_holds_is_not_downloaded_again(
    hub: FakeHfHub, store: Store, tmp_path: Path
) -> None:
    pulls = pulls_of(store, tmp_path)
    assert (await pulls.wait(pulls.start("hf:org/tiny", "admin").id)).state == "done"
    hub.seen.clear()
    again = await pulls.wait(pulls.start("hf:org/tiny", "admin").id)
    assert again.state == "done"
    assert not [s for s in hub.seen if s.path.startswith("/lfs/")]
    assert again.bytes_done == again.bytes_total


async def test_two_pulls_sharing_a_file_at_once_download_it_once(
    hub: FakeHfHub, store: Store, tmp_path: Path
) -> None:
    hub.repos["org/copy"] = small_repo()
    pulls = pulls_of(store, tmp_path)
    first, second = pulls.start("hf:org/tiny", "admin"), pulls.start("hf:org/copy", "admin")
    assert (await pulls.wait(first.id)).state == "done" and (await pulls.wait(second.id)).state == "done"
    lfs = hashlib.sha256(hub.repos["org/tiny"].files[SHARD]).hexdigest()
    assert offsets(hub.seen, f"/lfs/{lfs}") == [0]
    assert first.catalog_source == second.catalog_source
