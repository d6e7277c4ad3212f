"""``llmgw bundle``: offline bundles of llmgw's release, the mirror's engine builds and chosen models."""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

import typer

from llmgw.cli.mirrorbuilds import CONFIG, mirror_of, server_config
from llmgw.cli.options import TOKEN, URL, client
from llmgw.cli.output import console
from llmgw.mirror.bundles import BundleModel, check_bundle, create_bundle, import_bundle, unpack_bundle
from llmgw.mirror.releases import read_trusted_key

app = typer.Typer(
    help="Offline bundles: llmgw's signed release, engine builds and models.", no_args_is_help=True
)


@app.command("create")
def create(
    out: Path = typer.Argument(..., help="The bundle to write: a new directory, or with --tar a tar file."),
    tar: bool = typer.Option(False, "--tar", help="Write one tar file instead of a directory."),
    model: list[str] | None = typer.Option(None, "--model", help="A model whose files go in (repeat)."),
    release: Path = typer.Option(
        Path("dist/release"), "--release", help="The signed release ('make release')."
    ),
    config: Path | None = CONFIG,
    url: str | None = URL,
    token: str | None = TOKEN,
) -> None:
    """Write a bundle: the release with its signed checksums, every llama.cpp build the mirror holds,
    the chosen models' files and a manifest; the manifest's sha256 is printed, to carry apart."""
    settings = server_config(config)
    key = read_trusted_key(settings.path(settings.release.trusted_pub))
    blobs, index = mirror_of(settings)
    models = []
    if model:
        admin = client(url, token)
        models = [BundleModel(name, admin.model(name).definition) for name in model]
    path, digest = create_bundle(out, release, key, blobs, index, models, tar=tar)
    console.print(f"wrote the bundle {path}: {len(index.all())} engine builds, {len(models)} models")
    console.print("its manifest's sha256 (carry it apart, give it to 'llmgw bundle import'):")
    print(digest)


@app.command("import")
def import_(
    path: Path = typer.Argument(..., help="The bundle: a directory or a tar file."),
    manifest_sha256: str = typer.Option(
        ..., "--manifest-sha256", help="The digest printed when it was made."
    ),
    config: Path | None = CONFIG,
) -> None:
    """Check the whole bundle (the manifest's digest, the release's signature, every file's sha256),
    then put it into this control plane's mirror; one changed byte refuses it all."""
    settings = server_config(config)
    key = read_trusted_key(settings.path(settings.release.trusted_pub))
    blobs, index = mirror_of(settings)
    with tempfile.TemporaryDirectory(
        prefix=".bundle-", dir=blobs.root if blobs.root.is_dir() else None
    ) as work:
        checked = check_bundle(unpack_bundle(path, Path(work)), manifest_sha256, key)
        release_dir = asyncio.run(import_bundle(checked, blobs, index))
    console.print(
        f"imported llmgw {checked.release.version} (now in {release_dir}), {len(checked.builds)} "
        f"engine builds and the files of {len(checked.models)} models ({', '.join(checked.models) or 'none'})"
    )
    console.print(
        f"next: 'llmgw upgrade --from {release_dir}' here, 'llmgw ctl upgrade agents --release "
        f"{release_dir}' for the agents; add the models with 'llmgw ctl model add' "
        "(their definitions are in the manifest)"
    )
