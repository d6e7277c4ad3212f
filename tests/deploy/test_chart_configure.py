"""The chart's init step (files/configure.py): server.yaml on the data volume, from the Secrets."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import yaml

from .conftest import DEPLOY

SCRIPT = DEPLOY / "helm" / "llmgw" / "files" / "configure.py"


def configure(directory: Path, token: str, store_url: str = "") -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "LLMGW_DIR": str(directory),
        "LLMGW_ADMIN_TOKEN": token,
        "LLMGW_STORE_URL": store_url,
    }
    return subprocess.run([sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=120)


def test_first_start_creates_the_cluster_listening_on_every_address(tmp_path: Path) -> None:
    result = configure(tmp_path, "first-token-0123456789")
    assert result.returncode == 0, result.stderr
    config = yaml.safe_load((tmp_path / "server.yaml").read_text())
    assert config["admin_token_sha256"] == hashlib.sha256(b"first-token-0123456789").hexdigest()
    assert (config["http"]["host"], config["agent_server"]["host"]) == ("0.0.0.0", "0.0.0.0")
    assert config["store"]["url"] == ""
    assert {"ca.crt", "ca.key", "server.crt", "server.key", "llmgw.db"} <= {
        p.name for p in tmp_path.iterdir()
    }


def test_a_later_start_takes_a_rotated_token_and_keeps_the_ca(tmp_path: Path) -> None:
    assert configure(tmp_path, "first-token-0123456789").returncode == 0
    ca = (tmp_path / "ca.crt").read_bytes()
    assert configure(tmp_path, "second-token-0123456789").returncode == 0
    config = yaml.safe_load((tmp_path / "server.yaml").read_text())
    assert config["admin_token_sha256"] == hashlib.sha256(b"second-token-0123456789").hexdigest()
    assert (tmp_path / "admin.token").read_text().strip() == "second-token-0123456789"
    assert (tmp_path / "ca.crt").read_bytes() == ca


def test_a_missing_token_is_refused_with_what_to_set(tmp_path: Path) -> None:
    result = configure(tmp_path, "")
    assert result.returncode == 2
    assert "adminToken.value or adminToken.existingSecret" in result.stderr
    assert not (tmp_path / "server.yaml").exists()
