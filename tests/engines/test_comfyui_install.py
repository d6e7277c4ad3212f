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

from llmgw.engines.comfyui_builds import TORCH_BUILDS, Recipe, recipe, torch_builds
from llmgw.engines.comfyui_install import comfyui_dir, comfyui_for_node, install_comfyui, installed_comfyui
from llmgw.errors import BuildError

MAIN = "import sys\nprint('ComfyUI stand-in', sys.argv[1:])\n"


def release(tmp_path: Path, requirements: str, top: str = "ComfyUI-0.3.60") -> tuple[Path, str]:
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
    return recipe("0.3.60", digest, released, archive.as_uri())


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


def fake_install(cache: Path, made: Recipe, variant: str) -> None:
    """A whole install's folder (its build.json, python and main), as an earlier install left it."""
    folder = comfyui_dir(cache, made, next(b for b in TORCH_BUILDS if b.variant == variant))
    (folder / "venv/bin").mkdir(parents=True)
    (folder / "src").mkdir()
    (folder / "venv/bin/python").write_text("")
    (folder / "src/main.py").write_text("")
    record = {
        "torch": variant,
        "python": str(folder / "venv/bin/python"),
        "main": str(folder / "src/main.py"),
    }
    (folder / "build.json").write_text(json.dumps(record))


async def test_a_turing_node_keeps_its_installed_cuda_13_build(tmp_path: Path) -> None:
    made = recipe("0.3.60", "ab" * 32, "2025-09-23", "file:///nonexistent.tar.gz")
    fake_install(tmp_path, made, "cu126")
    fake_install(tmp_path, made, "cu130")
    kept = await comfyui_for_node(made, tmp_path, torch_builds("580.82.07", [(7, 5)]))
    assert kept.torch == "cu130" and kept.main.parent.parent.name.endswith("-cu130")


async def test_a_node_no_torch_fits_is_told_what_to_do(tmp_path: Path) -> None:
    made = recipe("0.3.60", "ab" * 32, "2025-09-23")
    with pytest.raises(BuildError) as caught:
        await comfyui_for_node(made, tmp_path, torch_builds("470.57.02", [(7, 5)]))
    assert "engines.comfyui" in caught.value.hint
