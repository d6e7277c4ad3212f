"""``llmgw release``, ``llmgw bundle`` and ``llmgw upgrade``'s refusals, as an operator runs them."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from llmgw.cli.main import app
from llmgw.errors import LlmgwError
from llmgw.mirror.blobs import BlobStore
from llmgw.mirror.builds import BuildIndex
from llmgw.mirror.releases import verify_release
from llmgw.testing.standin_builds import fake_llmgw_wheel


def run(*args: str) -> tuple[int, str]:
    """(0, the output) when the command worked; (1, the error it raised, hint included) when not."""
    answer = CliRunner().invoke(app, list(args), env={"COLUMNS": "200", "LLMGW_CONFIG": "/nonexistent"})
    if isinstance(answer.exception, LlmgwError):
        return 1, str(answer.exception)
    if answer.exception is not None and not isinstance(answer.exception, SystemExit):
        raise answer.exception
    return answer.exit_code, answer.output


def control_plane(directory: Path, key: Path) -> Path:
    """A control plane's directory: server.yaml, its data directory, the trusted key beside it."""
    directory.mkdir(parents=True)
    (directory / "server.yaml").write_text("name: cp1\ndata_dir: data\n")
    (directory / "trusted.pub").write_bytes(key.read_bytes())
    return directory / "server.yaml"


def test_keygen_release_bundle_and_import(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.mkdir()
    code, out = run(
        "release", "keygen", "--private", str(keys / "release.key"), "--public", str(keys / "trusted.pub")
    )
    assert code == 0, out
    wheel = fake_llmgw_wheel(tmp_path, "4.0.0")
    code, out = run(
        "release", "create", str(wheel), "--key", str(keys / "release.key"), "--out", str(tmp_path / "rel")
    )
    assert code == 0 and "release 4.0.0" in out, out
    assert verify_release(tmp_path / "rel", (keys / "trusted.pub").read_bytes()).version == "4.0.0"

    online = control_plane(tmp_path / "online", keys / "trusted.pub")
    bundle = tmp_path / "bundle.tar"
    code, out = run(
        "bundle", "create", str(bundle), "--tar", "--release", str(tmp_path / "rel"), "--config", str(online)
    )
    assert code == 0, out
    digest = out.strip().splitlines()[-1]
    assert len(digest) == 64

    offline = control_plane(tmp_path / "offline", keys / "trusted.pub")
    code, out = run("bundle", "import", str(bundle), "--manifest-sha256", "0" * 64, "--config", str(offline))
    assert code == 1 and "manifest.json was altered" in out, out
    assert not (tmp_path / "offline" / "data" / "mirror").exists()
    code, out = run("bundle", "import", str(bundle), "--manifest-sha256", digest, "--config", str(offline))
    assert code == 0 and "imported llmgw 4.0.0" in out, out
    mirror = tmp_path / "offline" / "data" / "mirror"
    assert (mirror / "releases" / "4.0.0" / wheel.name).read_bytes() == wheel.read_bytes()
    assert BuildIndex(mirror).all() == [] and BlobStore(mirror).has(
        verify_release(tmp_path / "rel", (keys / "trusted.pub").read_bytes()).sha256
    )


def test_upgrade_refuses_an_altered_release_before_pip_runs(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.mkdir()
    run("release", "keygen", "--private", str(keys / "release.key"), "--public", str(keys / "trusted.pub"))
    wheel = fake_llmgw_wheel(tmp_path, "4.0.0")
    run("release", "create", str(wheel), "--key", str(keys / "release.key"), "--out", str(tmp_path / "rel"))
    (tmp_path / "rel" / wheel.name).write_bytes(b"altered")
    code, out = run("upgrade", "--from", str(tmp_path / "rel"), "--trusted-pub", str(keys / "trusted.pub"))
    assert code == 1 and "was altered" in out, out
    code, out = run(
        "upgrade", "--from", "http://releases.example.com/4.0.0", "--trusted-pub", str(keys / "trusted.pub")
    )
    assert code == 1 and "only https" in out, out
