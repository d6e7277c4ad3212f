"""What stops a node from serving: the findings ``llmgw doctor`` reports, each with its fix.

:func:`diagnose` is pure: it takes what was read (the cards, the kernel
module's driver version, whether nvidia-smi is there, the engine builds
installed) and returns findings. An ``error`` stops the node or a card from
serving; a ``warning`` is worth fixing; ``ok`` says what was checked and found
well, so the report shows each card's mode and instances either way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from llmgw.agent.gpus import GpuReport, unavailable_reason
from llmgw.core.mig import device_label, mig_number
from llmgw.engines import builds

Severity = Literal["error", "warning", "ok"]


@dataclass(frozen=True)
class Finding:
    """One thing the doctor looked at."""

    severity: Severity
    subject: str
    """What it is about: ``driver``, ``card 0``, ``card 0/mig1``, ``llama.cpp``."""
    problem: str
    """What was found (for ``ok``: what is there)."""
    fix: str = ""
    """What to do; empty for ``ok``."""


@dataclass(frozen=True)
class NodeFacts:
    """What the doctor read from the node."""

    report: GpuReport | None
    """The cards, or None when no reader could read them."""
    kernel_driver: str | None
    """The version in ``/proc/driver/nvidia/version``; None when the module is not loaded."""
    nvidia_smi_found: bool
    installed_builds: tuple[builds.InstalledBuild, ...] = ()
    own_pids: frozenset[int] = frozenset()
    """Processes that are llmgw's engines; any other process on a card is reported."""


def _driver(facts: NodeFacts) -> list[Finding]:
    report = facts.report
    if report is None or not report.cards:
        if facts.kernel_driver:
            return [
                Finding(
                    "error",
                    "driver",
                    f"the NVIDIA kernel module {facts.kernel_driver} is loaded but no card could be read",
                    "run nvidia-smi by hand; a 'driver/library version mismatch' needs a reboot, "
                    "and 'dmesg | grep -i nvrm' shows why a card failed to initialise",
                )
            ]
        if facts.nvidia_smi_found:
            return [
                Finding(
                    "error",
                    "driver",
                    "nvidia-smi is installed but the NVIDIA kernel module is not loaded",
                    "load it with 'sudo modprobe nvidia' (or reboot after a driver install); "
                    "check 'dmesg | grep -i nvrm' for why it did not load",
                )
            ]
        return [Finding("ok", "driver", "no NVIDIA driver: this node serves on its CPU")]
    found = []
    if facts.kernel_driver and report.driver_version and facts.kernel_driver != report.driver_version:
        found.append(
            Finding(
                "error",
                "driver",
                f"the kernel module is {facts.kernel_driver} but the user-space library is "
                f"{report.driver_version}",
                "reboot (or unload and reload the nvidia modules) so both are the same version",
            )
        )
    version = report.driver_version or facts.kernel_driver or ""
    major = builds.driver_major(version)
    newest = max(builds.MIN_DRIVER.values())
    if major is not None and major < min(builds.MIN_DRIVER.values()):
        found.append(
            Finding(
                "warning",
                "driver",
                f"driver {version} is older than every CUDA build of llama.cpp needs "
                f"({min(builds.MIN_DRIVER.values())} or newer); engines fall back to Vulkan",
                f"install NVIDIA driver {newest} or newer",
            )
        )
    elif not found:
        found.append(Finding("ok", "driver", f"driver {version}, read through {report.reader}"))
    return found


def _cards(facts: NodeFacts) -> list[Finding]:
    found: list[Finding] = []
    for card in facts.report.cards if facts.report else ():
        subject = f"card {card.index}"
        reason = unavailable_reason(card)
        if reason:
            problem, _, fix = reason.partition(": ")
            found.append(Finding("error", subject, f"{card.name}: {problem}", fix))
        elif card.mig_enabled:
            instances = ", ".join(
                f"{device_label(mig_number(card.index, i.index))} {i.profile or '?'} ({i.memory_mb} MiB)"
                for i in card.instances
            )
            found.append(Finding("ok", subject, f"{card.name}, MIG on: {instances}"))
        else:
            mode = "MIG off" if card.mig_current.lower() == "disabled" else "no MIG"
            found.append(Finding("ok", subject, f"{card.name} ({card.memory_mb} MiB), {mode}"))
        if card.mig_change_pending:
            found.append(
                Finding(
                    "warning",
                    subject,
                    f"MIG mode is {card.mig_current} and becomes {card.mig_pending} at the next reset",
                    "stop what runs on the card and reset it "
                    f"('sudo nvidia-smi -r -i {card.index}') or reboot",
                )
            )
        for instance in card.instances:
            if not instance.uuid:
                found.append(
                    Finding(
                        "warning",
                        f"card {device_label(mig_number(card.index, instance.index))}",
                        "this MIG instance has no UUID, so no engine can be pointed at it",
                        "create its compute instance ('sudo nvidia-smi mig -i "
                        f"{card.index} -gi {instance.gpu_instance_id} -cci')",
                    )
                )
        if card.ecc_uncorrected:
            found.append(
                Finding(
                    "warning",
                    subject,
                    f"{card.ecc_uncorrected} uncorrected ECC errors since the driver loaded",
                    f"drain the node, reset the card ('sudo nvidia-smi -r -i {card.index}'); "
                    "if errors come back, have the card replaced",
                )
            )
        held = [p for i in card.instances for p in i.processes] if card.instances else list(card.processes)
        for process in held:
            if process.pid not in facts.own_pids:
                found.append(
                    Finding(
                        "warning",
                        subject,
                        f"process {process.pid} ({process.name or 'unknown'}) holds {process.used_mb} MiB "
                        "and is not one of llmgw's engines",
                        f"stop it ('kill {process.pid}') or leave the memory it holds out of your plans",
                    )
                )
    return found


def _builds(facts: NodeFacts) -> list[Finding]:
    has_cards = bool(facts.report and facts.report.cards)
    if not facts.installed_builds:
        return [
            Finding(
                "error",
                builds.LLAMACPP,
                f"no {builds.LLAMACPP} build is installed",
                "run 'llmgw engine install' (the agent also installs one when it first starts a model)",
            )
        ]
    variants = [b.build.variant for b in facts.installed_builds]
    if has_cards and all(v.startswith("cpu") for v in variants):
        return [
            Finding(
                "warning",
                builds.LLAMACPP,
                f"only CPU builds are installed ({', '.join(variants)}) on a node with NVIDIA cards",
                "run 'llmgw engine install' to install a CUDA or Vulkan build for the cards",
            )
        ]
    best = facts.installed_builds[0].build
    return [
        Finding("ok", builds.LLAMACPP, f"build {best.key} installed at {facts.installed_builds[0].binary}")
    ]


def diagnose(facts: NodeFacts) -> list[Finding]:
    """Every finding about the node: driver, cards and MIG states, engine builds."""
    return [*_driver(facts), *_cards(facts), *_builds(facts)]


def serving_blocked(findings: list[Finding]) -> bool:
    """True when any finding is an error."""
    return any(f.severity == "error" for f in findings)
