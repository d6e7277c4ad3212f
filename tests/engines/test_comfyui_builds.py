"""ComfyUI builds: recipes need a digest, requirements are PyPI packages only, torch by driver and card."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import pytest

from llmgw.engines.comfyui_builds import (
    TORCH_BUILDS,
    card_check_command,
    check_requirements,
    choose_installed,
    recipe,
    torch_builds,
)
from llmgw.engines.comfyui_install import requirements_command, torch_command
from llmgw.errors import BuildError, ValidationFailed

DIGEST = "ab" * 32
OPEN_MODULE = "580.82.07"  # what the open kernel module's version file gives, once read right
VOLTA, PASCAL, TURING, HOPPER = (7, 0), (6, 1), (7, 5), (9, 0)


def variants(driver: str | None, *cards: tuple[int, int] | None) -> list[str]:
    return [b.variant for b in torch_builds(driver, cards)]


@pytest.mark.parametrize(
    ("driver", "cards", "wanted"),
    [
        (OPEN_MODULE, [HOPPER], ["cu130", "cu129"]),
        (OPEN_MODULE, [TURING], ["cu130", "cu129"]),
        ("570.124.06", [HOPPER], ["cu129"]),  # CUDA 13 needs 580
        ("535.54.03", [TURING], ["cu129"]),
        (OPEN_MODULE, [VOLTA], ["cu126"]),  # cu129 and cu130 start at Turing
        ("535.54.03", [PASCAL], ["cu126"]),
        (OPEN_MODULE, [HOPPER, VOLTA], ["cu126"]),  # every card must run it
        ("470.57.02", [TURING], []),  # too old for any CUDA 12
        (OPEN_MODULE, [(5, 2)], []),  # Maxwell: no build
        (OPEN_MODULE, [None], ["cu130", "cu129"]),  # an unknown card: the builds for current cards
    ],
)
def test_torch_is_chosen_by_driver_and_card(
    driver: str, cards: list[tuple[int, int] | None], wanted: list[str]
) -> None:
    assert variants(driver, *cards) == wanted


def test_the_builds_come_from_pypi_and_pytorchs_indexes_by_their_real_names() -> None:
    by_variant = {b.variant: b for b in TORCH_BUILDS}
    assert by_variant["cu130"].install_arguments() == ["torch", "torchvision", "torchaudio"]
    assert by_variant["cu129"].install_arguments()[:2] == [
        "--index-url",
        "https://download.pytorch.org/whl/cu129",
    ]
    assert by_variant["cu126"].install_arguments()[:2] == [
        "--index-url",
        "https://download.pytorch.org/whl/cu126",
    ]


def test_an_installed_build_keeps_its_order_on_a_turing_card() -> None:
    wanted = torch_builds(OPEN_MODULE, [TURING])
    assert choose_installed(wanted, ["cu126", "cu130"]).variant == "cu130"  # type: ignore[union-attr]
    assert choose_installed(wanted, ["cu126"]) is None  # Volta's build is never taken on a Turing card
    assert choose_installed(torch_builds("535.54.03", [TURING]), ["cu130", "cu129"]).variant == "cu129"  # type: ignore[union-attr]


def test_the_install_commands_pin_pypi_to_the_day_after_the_release(tmp_path: Path) -> None:
    made = recipe("0.3.60", DIGEST, "2025-09-23")
    python = tmp_path / "venv/bin/python"
    command = requirements_command("uv", python, made, tmp_path / "requirements.txt")
    assert command[command.index("--exclude-newer") + 1] == "2025-09-24"
    assert "--index-url" not in command
    cu126 = torch_builds(OPEN_MODULE, [VOLTA])[0]
    assert torch_command("uv", python, cu126) == [
        "uv", "pip", "install", "--python", str(python),
        "--index-url", "https://download.pytorch.org/whl/cu126", "torch", "torchvision", "torchaudio",
    ]  # fmt: skip
    assert "torch.cuda" in card_check_command(python)[-1]


def test_a_recipe_without_a_digest_is_refused() -> None:
    for digest in (None, ""):
        with pytest.raises(ValidationFailed) as caught:
            recipe("0.3.60", digest, "2025-09-23")
        assert "no digest" in dict(caught.value.problems)["sha256"]


def test_a_recipe_with_a_bad_digest_date_or_url_names_each_field() -> None:
    with pytest.raises(ValidationFailed) as caught:
        recipe("0.3.60", "abc", "last tuesday", "http://example.com/a.tar.gz")
    assert set(dict(caught.value.problems)) == {"sha256", "released", "url"}
    made = recipe("0.3.60", "sha256:" + DIGEST.upper(), "2025-09-23")
    assert (made.sha256, made.released) == (DIGEST, date(2025, 9, 23))
    assert made.archive_url == "https://github.com/comfyanonymous/ComfyUI/archive/refs/tags/v0.3.60.tar.gz"


@pytest.mark.parametrize(
    ("line", "number"),
    [
        ("-e git+https://github.com/a/b#egg=b", 3),
        ("--index-url https://example.com/simple", 3),
        ("b @ https://example.com/b.whl", 3),
        ("git+https://github.com/a/b", 3),
        ("./vendor/b", 3),
        ("-r more.txt", 3),
    ],
)
def test_a_requirements_file_naming_anything_but_pypi_packages_is_refused_naming_the_line(
    line: str, number: int
) -> None:
    with pytest.raises(BuildError) as caught:
        check_requirements(f"torch\n# a comment\n{line}\n")
    assert f"line {number}" in str(caught.value) and line in str(caught.value)


def test_pypi_requirements_with_comments_and_markers_are_kept() -> None:
    text = "torch\n\n# non essential\nnumpy>=1.25.0  # speed\nav>=14.2.0; platform_system != 'Darwin'\n"
    assert check_requirements(text) == ["torch", "numpy>=1.25.0", "av>=14.2.0; platform_system != 'Darwin'"]


@pytest.mark.parametrize("version", ["0.3.56", "0.3.10", "0.2.7", "master"])
def test_a_release_whose_interrupt_stops_whatever_runs_is_refused(version: str) -> None:
    with pytest.raises(ValidationFailed) as caught:
        recipe(version, DIGEST, "2025-08-30")
    why = dict(caught.value.problems)["version"]
    assert "0.3.57" in why if version != "master" else "not a release's version" in why


@pytest.mark.parametrize("version", ["0.3.57", "v0.3.58", "0.3.64", "0.38.1"])
def test_a_release_whose_interrupt_honours_the_prompt_id_is_taken(version: str) -> None:
    assert recipe(version, DIGEST, "2025-09-04").version == version
