"""``llmgw doctor``: each finding about the driver, cards, MIG and builds names its fix."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from typer.testing import CliRunner

from llmgw.agent.diagnosis import Finding, NodeFacts, diagnose, serving_blocked
from llmgw.agent.gpus import GpuReport
from llmgw.agent.nvidia_smi import parse_report
from llmgw.cli.main import app
from llmgw.engines.builds import LLAMACPP, Build, InstalledBuild
from llmgw.engines.buildverdicts import Verdict
from llmgw.testing.nvidia_smi_standin import (
    A100_80G_MIG,
    A100_80G_MIG_EMPTY,
    H100_80G,
    FakeCard,
    FakeProcess,
    FakeSystem,
    install_fake_nvidia_smi,
    render_list,
    render_xml,
)

CUDA = InstalledBuild(Build(LLAMACPP, "b11434", "cuda-12.8", "release"), Path("/opt/llama-server"))
CPU = InstalledBuild(Build(LLAMACPP, "b11434", "cpu", "release"), Path("/opt/llama-server"))


def report(*cards: FakeCard, driver: str = "570.86.15") -> GpuReport:
    system = FakeSystem(cards, driver_version=driver)
    return parse_report(render_xml(system), render_list(system))


def facts(*cards: FakeCard, **changes: object) -> NodeFacts:
    base = NodeFacts(report(*cards), "570.86.15", True, (CUDA,))
    return replace(base, **changes)  # type: ignore[arg-type]


def about(findings: list[Finding], subject: str) -> list[Finding]:
    return [f for f in findings if f.subject == subject]


def test_a_healthy_node_has_nothing_but_ok() -> None:
    findings = diagnose(facts(H100_80G, A100_80G_MIG))

    assert not serving_blocked(findings)
    assert {f.severity for f in findings} == {"ok"}
    (mig,) = about(findings, "card 1")
    assert "MIG on: 1/mig0 3g.40gb (40192 MiB), 1/mig1 2g.20gb" in mig.problem


def test_a_mig_card_with_nothing_carved_is_an_error_naming_how_to_carve() -> None:
    findings = diagnose(facts(H100_80G, A100_80G_MIG_EMPTY))

    (error,) = [f for f in findings if f.severity == "error"]
    assert error.subject == "card 1" and "no instance is carved" in error.problem
    assert "nvidia-smi mig -i 1 -cgi PROFILE -C" in error.fix
    assert serving_blocked(findings)


def test_a_pending_mig_change_is_a_warning_to_reset_the_card() -> None:
    pending = replace(H100_80G, mig_mode="Disabled", mig_pending="Enabled")

    (warning,) = [f for f in diagnose(facts(pending)) if f.severity == "warning"]
    assert "becomes Enabled at the next reset" in warning.problem
    assert "nvidia-smi -r -i 0" in warning.fix


def test_a_driver_that_is_not_loaded_is_an_error() -> None:
    findings = diagnose(NodeFacts(None, None, True, (CUDA,)))

    assert about(findings, "driver")[0].severity == "error"
    assert "modprobe nvidia" in about(findings, "driver")[0].fix


def test_a_node_without_nvidia_serves_on_its_cpu() -> None:
    findings = diagnose(NodeFacts(None, None, False, (CPU,)))

    assert [f.severity for f in findings] == ["ok", "ok"]


def test_a_kernel_module_and_library_of_different_versions_need_a_reboot() -> None:
    (finding,) = about(diagnose(facts(H100_80G, kernel_driver="580.82.07")), "driver")

    assert finding.severity == "error" and "580.82.07" in finding.problem and "reboot" in finding.fix


def test_a_driver_too_old_for_cuda_builds_is_a_warning() -> None:
    old = NodeFacts(report(H100_80G, driver="535.104.05"), "535.104.05", True, (CUDA,))

    (finding,) = about(diagnose(old), "driver")
    assert finding.severity == "warning" and "install NVIDIA driver 580" in finding.fix


def test_no_build_or_only_cpu_builds_on_a_gpu_node_are_found() -> None:
    none = about(diagnose(facts(H100_80G, installed_builds=())), "llama.cpp")
    cpu_only = about(diagnose(facts(H100_80G, installed_builds=(CPU,))), "llama.cpp")

    assert none[0].severity == "error" and "llmgw engine install" in none[0].fix
    assert cpu_only[0].severity == "warning" and "CUDA or Vulkan" in cpu_only[0].fix


def test_foreign_processes_and_ecc_errors_are_warnings() -> None:
    card = replace(
        H100_80G, ecc_uncorrected=3, processes=(FakeProcess(77, "python3", 4096), FakeProcess(5, "e", 1))
    )

    warnings = [f for f in diagnose(facts(card, own_pids=frozenset({5}))) if f.severity == "warning"]
    assert [w.problem.split(" ")[0:2] for w in warnings] == [["3", "uncorrected"], ["process", "77"]]
    assert all(w.fix for w in warnings)


def test_the_command_reads_the_cards_and_exits_1_on_an_error(tmp_path: Path) -> None:
    script = install_fake_nvidia_smi(tmp_path / "bin", [H100_80G, A100_80G_MIG_EMPTY])
    proc_version = tmp_path / "version"
    proc_version.write_text(
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.14  Release Build  "
        "(dvs-builder@U22-I3-AE18-09-3)  Wed Aug 27 23:24:51 UTC 2025\n"
    )

    result = CliRunner().invoke(
        app,
        [
            "doctor",
            "--nvidia-smi",
            str(script),
            "--cache-dir",
            str(tmp_path / "cache"),
            "--proc-version",
            str(proc_version),
            "--json",
        ],
    )

    assert result.exit_code == 1, result.output
    findings = json.loads(result.output)
    assert {(f["subject"], f["severity"]) for f in findings} >= {
        ("card 0", "ok"),
        ("card 1", "error"),
        ("llama.cpp", "error"),
    }
    assert all(f["fix"] for f in findings if f["severity"] != "ok")


def test_builds_refused_here_are_warnings_with_their_fix_and_stale_ones_are_retried() -> None:
    node = facts(H100_80G).node
    refused = Verdict(
        "llama.cpp", "b11434-cuda-13.4", False, "a token computed on the CPU", "fix it", str(node)
    )
    stale = Verdict("vllm", "0.33.0-cu130", False, "vllm._C does not import", "fix", "driver 550.1; 1x H100")
    findings = diagnose(facts(H100_80G, refusals=(refused, stale)))

    (warning,) = [f for f in findings if f.severity == "warning"]
    assert warning.subject == "llama.cpp" and "b11434-cuda-13.4 was refused" in warning.problem
    assert "a token computed on the CPU" in warning.problem and warning.fix == "fix it"
    (retried,) = about(findings, "vllm")
    assert retried.severity == "ok" and "the next install tries it again" in retried.problem


def test_a_node_whose_every_installed_build_was_refused_cannot_serve() -> None:
    cuda = InstalledBuild(Build(LLAMACPP, "b11434", "cuda-13.4", "release"), Path("/opt/llama-server"))
    node = facts(H100_80G).node
    refused = Verdict("llama.cpp", "b11434-cuda-13.4", False, "no token", "fix it", str(node))

    findings = about(diagnose(facts(H100_80G, installed_builds=(cuda,), refusals=(refused,))), "llama.cpp")

    assert findings[0].severity == "error" and "were refused" in findings[0].problem
    assert "--retry-refused" in findings[0].fix
