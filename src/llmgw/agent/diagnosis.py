"""What stops a node from serving: the findings ``llmgw doctor`` reports, each with its fix.

:func:`diagnose` is pure: it takes what was read (the cards, the kernel
module's driver version, whether nvidia-smi is there, the engine builds
installed and the builds refused here) and returns findings. An ``error`` stops the node or a card from
serving; a ``warning`` is worth fixing; ``ok`` says what was checked and found
well, so the report shows each card's mode and instances either way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from llmgw.agent.gpus import GpuReport, devices_of, unavailable_reason
from llmgw.core.mig import device_label, mig_number
from llmgw.engines import builds, buildverdicts, pythonbuilds
from llmgw.engines.buildverdicts import NodeConditions, Verdict

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
    python_builds: tuple[pythonbuilds.InstalledPythonBuild, ...] = ()
    refusals: tuple[Verdict, ...] = ()
    """The builds refused on this node (:mod:`llmgw.engines.buildverdicts`)."""

    @property
    def node(self) -> NodeConditions:
        """The node as its agent sees it when it checks builds: the driver and each device's name."""
        devices = devices_of(self.report) if self.report else []
        driver = self.kernel_driver or (self.report.driver_version if self.report else "")
        return NodeConditions.of(driver, (device.name for device in devices))


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


def _checked(check: Verdict | None, node: NodeConditions) -> str:
    if check is not None and check.holds(node):
        return f"; passed its check on {check.checked_at}: {check.found}"
    return "; not checked on this node as it is now (the next install or agent start checks it)"


def _builds(facts: NodeFacts) -> list[Finding]:
    has_cards = bool(facts.report and facts.report.cards)
    node = facts.node
    holding = [v for v in facts.refusals if v.holds(node)]
    refused = {(v.engine, v.build) for v in holding}
    usable = [b for b in facts.installed_builds if (b.build.engine, b.build.key) not in refused]
    found = _llamacpp(usable, has_cards, node, refused)
    for item in facts.python_builds:
        if (item.build.engine, item.build.key) not in refused:
            where = f"build {item.build.key} installed at {item.program}"
            found.append(Finding("ok", item.build.engine, where + _checked(item.check, node)))
    for verdict in facts.refusals:
        if verdict.holds(node):
            problem = f"build {verdict.build} was refused on {verdict.checked_at}: {verdict.found}"
            found.append(Finding("warning", verdict.engine, problem, verdict.fix))
        else:
            found.append(
                Finding(
                    "ok",
                    verdict.engine,
                    f"build {verdict.build} was refused with {verdict.node}; the node has changed since, "
                    "so the next install tries it again",
                )
            )
    return found


def _llamacpp(
    usable: list[builds.InstalledBuild],
    has_cards: bool,
    node: NodeConditions,
    refused: set[tuple[str, str]],
) -> list[Finding]:
    if not usable:
        if any(engine == builds.LLAMACPP for engine, _ in refused):
            return [
                Finding(
                    "error",
                    builds.LLAMACPP,
                    f"no {builds.LLAMACPP} build that computes here is installed: the builds below were "
                    "refused",
                    f"fix the first refusal's cause; {buildverdicts.retry_hint(builds.LLAMACPP)}",
                )
            ]
        return [
            Finding(
                "error",
                builds.LLAMACPP,
                f"no {builds.LLAMACPP} build is installed",
                "run 'llmgw engine install' (the agent also installs one when it first starts a model)",
            )
        ]
    variants = [b.build.variant for b in usable]
    if has_cards and all(v.startswith("cpu") for v in variants):
        return [
            Finding(
                "warning",
                builds.LLAMACPP,
                f"only CPU builds are installed ({', '.join(variants)}) on a node with NVIDIA cards",
                "run 'llmgw engine install' to install a CUDA or Vulkan build for the cards",
            )
        ]
    best = usable[0]
    where = f"build {best.build.key} installed at {best.binary}"
    return [Finding("ok", builds.LLAMACPP, where + _checked(best.check, node))]


def diagnose(facts: NodeFacts) -> list[Finding]:
    """Every finding about the node: driver, cards and MIG states, engine builds."""
    return [*_driver(facts), *_cards(facts), *_builds(facts)]


def serving_blocked(findings: list[Finding]) -> bool:
    """True when any finding is an error."""
    return any(f.severity == "error" for f in findings)
