"""Installing ComfyUI from a local release archive: digest, requirements check, uv against PyPI."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import subprocess
import tarfile
from pathlib import Path

import pytest

from llmgw.engines.comfyui_builds import Recipe, recipe
from llmgw.engines.comfyui_install import comfyui_dir, install_comfyui, installed_comfyui
from llmgw.errors import BuildError

MAIN = "import sys\nprint('ComfyUI stand-in', sys.argv[1:])\n"


def release(tmp_path: Path, requirements: str, top: str = "ComfyUI-0.0.1") -> tuple[Path, str]:
    """A release archive as GitHub makes one (one top folder); its path and sha256."""
    archive = tmp_path / "release.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for name, text in (("main.py", MAIN), ("requirements.txt", requirements), ("comfy/__init__.py", "")):
            data = text.encode()
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return archive, hashlib.sha256(archive.read_bytes()).hexdigest()


def local_recipe(archive: Path, digest: str, released: str = "2025-01-01") -> Recipe:
    return recipe("0.0.1", digest, released, archive.as_uri())


async def test_an_archive_whose_digest_differs_is_refused_and_leaves_nothing(tmp_path: Path) -> None:
    archive, _ = release(tmp_path, "six\n")
    made = local_recipe(archive, "0" * 64)
    with pytest.raises(BuildError) as caught:
        await install_comfyui(made, tmp_path / "cache", None)
    assert "not the recipe's" in str(caught.value)
    assert not comfyui_dir(tmp_path / "cache", made, None).exists()


async def test_a_release_whose_requirements_name_a_url_is_refused_before_anything_installs(
    tmp_path: Path,
) -> None:
    archive, digest = release(tmp_path, "six\n--extra-index-url https://example.com/simple\n")
    with pytest.raises(BuildError) as caught:
        await install_comfyui(local_recipe(archive, digest), tmp_path / "cache", None)
    assert "line 2" in str(caught.value) and "--extra-index-url" in str(caught.value)


@pytest.mark.e2e
async def test_a_release_installs_with_uv_as_pypi_stood_the_day_after(tmp_path: Path) -> None:
    archive, digest = release(tmp_path, "# tiny\nsix\n")
    made = local_recipe(archive, digest, "2024-01-01")  # six 1.16.0 was current; 1.17.0 came in Dec 2024
    steps: list[str] = []
    built = await install_comfyui(made, tmp_path / "cache", None, progress=lambda m, f: steps.append(m))
    assert built.main.read_text() == MAIN and built.torch == ""
    answer = await asyncio.to_thread(
        subprocess.run,
        [str(built.python), "-c", "import six; print(six.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert answer.stdout.strip() == "1.16.0"
    assert installed_comfyui(tmp_path / "cache", made, None) == built
    record = json.loads((comfyui_dir(tmp_path / "cache", made, None) / "build.json").read_text())
    assert (record["python"], record["main"]) == (str(built.python), str(built.main))
    assert not any("torch" in step for step in steps)
    again = await install_comfyui(made, tmp_path / "cache", None, progress=lambda m, f: steps.append(m))
    assert again == built and steps.count("creating the virtualenv") == 1
