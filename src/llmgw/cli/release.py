"""``llmgw release``: the release key pair, and signing a built wheel into a release directory."""

from __future__ import annotations

from pathlib import Path

import typer

from llmgw.cli.output import console
from llmgw.mirror.releases import write_release
from llmgw.pki.signing import generate_signing_key

app = typer.Typer(
    help="Signed releases of llmgw: the key pair and release directories.", no_args_is_help=True
)


@app.command("keygen")
def keygen(
    private: Path = typer.Option(Path("release.key"), help="Where the private key goes (PEM, 0600)."),
    public: Path = typer.Option(Path("trusted.pub"), help="Where the public key goes (PEM)."),
) -> None:
    """Make the release key pair: keep the private half offline, give every machine the public half
    (``trusted.pub`` beside server.yaml and agent.yaml)."""
    generate_signing_key(private, public)
    console.print(f"wrote {private} (private, 0600) and {public} (public: copy it beside every config)")


@app.command("create")
def create(
    wheel: Path = typer.Argument(..., help="llmgw's built wheel (llmgw-<version>-py3-none-any.whl)."),
    key: Path = typer.Option(..., "--key", help="The release key's private half."),
    out: Path = typer.Option(Path("dist/release"), "--out", help="The release directory to write."),
) -> None:
    """Write a signed release: the wheel, its SHA256SUMS and SHA256SUMS.sig."""
    release = write_release(out, wheel, key)
    console.print(f"release {release.version} in {out} (wheel sha256 {release.sha256})")
