"""agent.yaml's address: the one address engines listen on, never a wildcard."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from llmgw.agent.config import load_agent_config
from llmgw.errors import ConfigError


def write(tmp_path: Path, address: str) -> Path:
    path = tmp_path / "agent.yaml"
    path.write_text(
        yaml.safe_dump({"node_id": "gpu1", "control_planes": ["10.0.0.10:8443"], "address": address})
    )
    return path


@pytest.mark.parametrize("address", ["0.0.0.0", "::", "[::]", ""])
def test_a_wildcard_address_is_refused_saying_what_to_give(tmp_path: Path, address: str) -> None:
    with pytest.raises(ConfigError, match=r"address: .*is every address.*give the one address"):
        load_agent_config(write(tmp_path, address))


@pytest.mark.parametrize("address", ["10.0.0.21", "127.0.0.1", "fd00::21", "gpu01.internal"])
def test_one_address_is_kept(tmp_path: Path, address: str) -> None:
    assert load_agent_config(write(tmp_path, address)).address == address
