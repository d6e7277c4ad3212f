"""``llmgw engine install`` takes only a build that computes here; doctor and engine-check show why.

The machine has one H100 (a fake nvidia-smi) and two llama.cpp builds installed as an older llmgw
left them, never checked: CUDA 13.4, which prints its version but keeps every layer on the CPU, and
CUDA 12.8, which computes on the card.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import pytest
from typer.testing import CliRunner

from llmgw.cli.main import app
from llmgw.engines import buildverdicts
from llmgw.engines.builds import LLAMACPP_TAG, Build, install_dir, installed, llamacpp_builds
from llmgw.testing.nvidia_smi_standin import H100_80G, install_fake_nvidia_smi
from llmgw.testing.standin_builds import Behaviour, fake_llama_server

CUDA13, CUDA12 = f"{LLAMACPP_TAG}-cuda-13.4", f"{LLAMACPP_TAG}-cuda-12.8"


def _left_installed(cache: Path, build: Build, behaviour: Behaviour) -> None:
    folder = install_dir(cache, build)
    folder.mkdir(parents=True)
    (folder / "llama-server").write_bytes(fake_llama_server(behaviour))
    (folder / "llama-server").chmod(0o755)
    record = {"build": asdict(build), "sha256": {}, "installed_at": "2026-01-01T00:00:00+00:00"}
    (folder / "build.json").write_text(json.dumps(record))


@pytest.fixture
def machine(tmp_path: Path) -> tuple[Path, list[str]]:
    cache = tmp_path / "cache"
    smi = install_fake_nvidia_smi(tmp_path / "bin", [H100_80G], driver_version="580.82.07")
    cuda13, cuda12, _vulkan = llamacpp_builds(has_nvidia=True, driver_version="580.82.07", arch="x86_64")
    _left_installed(cache, cuda13, "layers-on-cpu")
    _left_installed(cache, cuda12, "cuda")
    return cache, ["--nvidia-smi", str(smi), "--proc-version", str(tmp_path / "no-module")]


def _run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, " ".join(result.output.split())


def test_engine_install_refuses_a_build_that_computes_on_the_cpu_and_takes_the_next(
    machine: tuple[Path, list[str]],
) -> None:
    cache, node = machine

    code, output = _run("engine", "install", "--cache-dir", str(cache), *node)

    assert code == 0, output
    assert f"refused llama.cpp {CUDA13}: a token computed on the CPU (build cuda-13.4)" in output
    assert "--retry-refused" in output
    assert f"llama.cpp {LLAMACPP_TAG} (cuda-12.8)" in output
    assert "accepted a token computed on CUDA0, 3 of 3 layers offloaded" in output
    (best,) = [item for item in installed(cache) if item.check is not None]
    assert best.build.key == CUDA12 and best.check is not None and best.check.node.startswith("driver 580")

    (refusal,) = buildverdicts.refusals(cache)
    code, again = _run("engine", "install", "--cache-dir", str(cache), *node)
    assert code == 0 and f"refused llama.cpp {CUDA13}" in again  # still refused and shown
    assert buildverdicts.refusals(cache) == [refusal]  # not checked again

    code, retried = _run("engine", "install", "--cache-dir", str(cache), "--retry-refused", *node)
    assert code == 0 and f"llama.cpp {CUDA13}: refused on" in retried and "tried again" in retried
    assert f"refused llama.cpp {CUDA13}" in retried  # checked again, refused again: it still fails


def test_doctor_and_engine_check_show_the_accepted_build_and_every_refused_one(
    machine: tuple[Path, list[str]],
) -> None:
    cache, node = machine
    assert _run("engine", "install", "--cache-dir", str(cache), *node)[0] == 0

    doctor = CliRunner().invoke(app, ["doctor", "--cache-dir", str(cache), "--json", *node])
    assert doctor.exit_code == 0, doctor.output
    findings = [f for f in json.loads(doctor.output) if f["subject"] == "llama.cpp"]
    ok = [f for f in findings if f["severity"] == "ok"]
    refused = [f for f in findings if f["severity"] == "warning"]
    assert len(ok) == 1 and f"build {CUDA12} installed" in ok[0]["problem"]
    assert "passed its check" in ok[0]["problem"] and "3 of 3 layers offloaded" in ok[0]["problem"]
    assert len(refused) == 1 and f"build {CUDA13} was refused on" in refused[0]["problem"]
    assert "found no usable GPU" in refused[0]["problem"] and "--retry-refused" in refused[0]["fix"]

    result = CliRunner().invoke(app, ["ctl", "engine-check", "--cache-dir", str(cache), "--json", *node])
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    cuda12 = llamacpp_builds(has_nvidia=True, driver_version="580.82.07", arch="x86_64")[1]
    assert document["ok"] and document["build"] == str(install_dir(cache, cuda12) / "llama-server")
    assert [v["build"] for v in document["accepted"]] == [CUDA12]
    assert [v["build"] for v in document["refused"]] == [CUDA13]
    assert "found no usable GPU" in document["refused"][0]["found"]

    code, shown = _run("ctl", "engine-check", "--cache-dir", str(cache), *node)
    assert code == 0 and f"refused at install: llama.cpp {CUDA13}" in shown
    assert f"accepted at install: llama.cpp {CUDA12}" in shown
