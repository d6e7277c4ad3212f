"""node add's release: checked on this machine before anything reaches the other one."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from llmgw.controlplane.config import load_server_config
from llmgw.mirror.releases import write_release
from llmgw.operations.onboarding import StepFailed
from llmgw.pki.signing import generate_signing_key
from llmgw.provisioning.clusters import initialise
from llmgw.provisioning.machines import release_files


@pytest.fixture
def signed(tmp_path: Path) -> Path:
    cluster = tmp_path / "cluster"
    initialise(cluster, name="cp1", http_host="127.0.0.1", http_port=1, agent_host="127.0.0.1", agent_port=2)
    generate_signing_key(tmp_path / "release.key", cluster / "trusted.pub")
    wheel = tmp_path / "llmgw-1.2.3-py3-none-any.whl"
    wheel.write_bytes(b"wheel")
    write_release(tmp_path / "release", wheel, tmp_path / "release.key")
    return tmp_path / "release"


def test_a_signed_release_is_handed_on_with_the_clusters_key(tmp_path: Path, signed: Path) -> None:
    config = load_server_config(tmp_path / "cluster/server.yaml")
    files = release_files(config, str(signed), tmp_path / "scratch")
    assert (files.version, files.wheel) == ("1.2.3", "llmgw-1.2.3-py3-none-any.whl")
    assert set(files.files) == {files.wheel, "SHA256SUMS", "SHA256SUMS.sig"}
    assert files.trusted_pub == (tmp_path / "cluster/trusted.pub").read_bytes()


@pytest.mark.parametrize(
    ("spoil", "said"),
    [
        (lambda release: (release / "SHA256SUMS.sig").unlink(), "is not signed"),
        (lambda release: (release / "llmgw-1.2.3-py3-none-any.whl").write_bytes(b"other"), "was altered"),
        (lambda release: None, ""),
    ],
)
def test_an_unsigned_or_altered_release_or_none_at_all_fails_the_install_step(
    tmp_path: Path, signed: Path, spoil: Callable[[Path], object], said: str
) -> None:
    config = load_server_config(tmp_path / "cluster/server.yaml")
    spoil(signed)
    with pytest.raises(StepFailed) as raised:
        release_files(config, str(signed) if said else "", tmp_path / "scratch")
    assert raised.value.step == "install"
    assert said in raised.value.message if said else "--release" in raised.value.hint


def test_without_release_the_newest_release_in_this_control_planes_mirror_is_used(
    tmp_path: Path, signed: Path
) -> None:
    config = load_server_config(tmp_path / "cluster/server.yaml")
    kept = config.data_path / "mirror" / "releases"
    for version in ("1.2.3", "1.10.0"):
        wheel = tmp_path / f"llmgw-{version}-py3-none-any.whl"
        wheel.write_bytes(version.encode())
        write_release(kept / version, wheel, tmp_path / "release.key")
    for source in ("", "mirror"):
        assert release_files(config, source, tmp_path / "scratch").version == "1.10.0"
