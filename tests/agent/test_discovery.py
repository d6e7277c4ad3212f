"""Discovery against a stand-in nvidia-smi and a fake /proc and cgroup tree."""

from __future__ import annotations

import logging
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from llmgw.agent.discovery import (
    discover,
    parse_cpu_max,
    parse_driver_version,
    parse_memory_max,
    parse_nvidia_smi_xml,
)
from llmgw.core.devices import NodeInventory
from llmgw.testing.nvidia_smi_standin import (
    A100_80G,
    DRIVER_NOT_LOADED,
    H100_80G,
    RTX_4090,
    V100_32G,
    FakeCard,
    FakeFailure,
    FakeProcess,
    FakeSystem,
    install_fake_nvidia_smi,
    render_xml,
)

PROPRIETARY = (
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.14  Thu Feb 22 01:44:30 UTC 2024\n"
    "GCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04)\n"
)
OPEN_MODULE = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.82.07  Release Build  "
    "(dvs-builder@U22-I3-AE18-09-3)  Wed Aug 27 23:24:51 UTC 2025\n"
    "GCC version:  gcc version 13.3.0 (Ubuntu 13.3.0-6ubuntu2~24.04)\n"
)
MEMINFO = "MemTotal:       65536000 kB\nMemFree:         1000000 kB\nMemAvailable:   32768000 kB\n"
CPUINFO = "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 7763 64-Core Processor\n"


@pytest.fixture
def host(tmp_path: Path) -> dict[str, Path]:
    """A /proc and a cgroup tree with no limits, and no NVIDIA driver."""
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "meminfo").write_text(MEMINFO)
    (proc / "cpuinfo").write_text(CPUINFO)
    (proc / "self" / "cgroup").write_text("0::/\n")
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    return {
        "proc_root": proc,
        "cgroup_root": cgroup,
        "proc_version": proc / "driver" / "nvidia" / "version",
        "nvidia_smi": tmp_path / "bin" / "nvidia-smi",
    }


async def run(host: dict[str, Path], **overrides: Any) -> NodeInventory:
    arguments: dict[str, Any] = {
        "nvidia_smi": str(host["nvidia_smi"]),
        "proc_version": host["proc_version"],
        "proc_root": host["proc_root"],
        "cgroup_root": host["cgroup_root"],
    }
    arguments.update(overrides)
    return await discover("node-1", "10.0.0.7", **arguments)


def write_proc_version(host: dict[str, Path], text: str) -> None:
    host["proc_version"].parent.mkdir(parents=True)
    host["proc_version"].write_text(text)


async def test_cards_are_read_from_nvidia_smi(host: dict[str, Path]) -> None:
    install_fake_nvidia_smi(host["nvidia_smi"].parent, [A100_80G, H100_80G])

    inventory = await discover(
        "node-1", "10.0.0.7", nvidia_smi=str(host["nvidia_smi"]), proc_version=host["proc_version"]
    )

    [a100, h100] = inventory.gpus
    assert (a100.index, a100.name, a100.memory_mb, a100.memory_free_mb) == (
        0,
        "NVIDIA A100-SXM4-80GB",
        81920,
        81920 - 566 - 4,
    )
    assert (h100.index, h100.name, h100.memory_mb) == (1, "NVIDIA H100 80GB HBM3", 81559)
    assert a100.uuid.startswith("GPU-") and h100.uuid.startswith("GPU-") and a100.uuid != h100.uuid


async def test_each_card_gets_its_class(host: dict[str, Path]) -> None:
    install_fake_nvidia_smi(host["nvidia_smi"].parent, [A100_80G, H100_80G, V100_32G, RTX_4090])

    inventory = await run(host)

    assert [gpu.device_class for gpu in inventory.gpus] == ["a100-80g", "h100-80g", "v100-32g", "rtx4090-24g"]


async def test_memory_held_by_processes_is_not_free(host: dict[str, Path]) -> None:
    busy = FakeCard("NVIDIA L4", 23034, processes=(FakeProcess(4242, "python3", 10000),))
    install_fake_nvidia_smi(host["nvidia_smi"].parent, [busy])

    inventory = await run(host)

    assert inventory.gpus[0].memory_free_mb == 23034 - 10000


async def test_the_driver_version_is_read_from_the_proprietary_module(host: dict[str, Path]) -> None:
    install_fake_nvidia_smi(host["nvidia_smi"].parent, [A100_80G], driver_version="999.0")
    write_proc_version(host, PROPRIETARY)

    inventory = await run(host)

    assert inventory.driver_version == "550.54.14"


async def test_the_driver_version_is_read_from_the_open_kernel_module(host: dict[str, Path]) -> None:
    install_fake_nvidia_smi(host["nvidia_smi"].parent, [H100_80G], driver_version="999.0")
    write_proc_version(host, OPEN_MODULE)

    inventory = await run(host)

    assert inventory.driver_version == "580.82.07"


async def test_without_the_proc_file_the_driver_version_comes_from_nvidia_smi(
    host: dict[str, Path],
) -> None:
    install_fake_nvidia_smi(host["nvidia_smi"].parent, [H100_80G], driver_version="570.133.20")

    inventory = await run(host)

    assert inventory.driver_version == "570.133.20"


async def test_without_nvidia_smi_the_node_has_only_its_cpu(host: dict[str, Path]) -> None:
    inventory = await run(host)

    assert [device.kind for device in inventory.devices] == ["cpu"]
    assert inventory.driver_version == ""


async def test_nvidia_smi_is_found_on_path(host: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    install_fake_nvidia_smi(host["nvidia_smi"].parent, [RTX_4090])
    monkeypatch.setenv("PATH", str(host["nvidia_smi"].parent))

    inventory = await run(host, nvidia_smi="nvidia-smi")

    assert [gpu.name for gpu in inventory.gpus] == ["NVIDIA GeForce RTX 4090"]


async def test_a_failing_nvidia_smi_means_no_cards_and_a_warning(
    host: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    install_fake_nvidia_smi(host["nvidia_smi"].parent, [A100_80G], failure=DRIVER_NOT_LOADED)

    with caplog.at_level(logging.WARNING, logger="llmgw.agent.discovery"):
        inventory = await run(host)

    assert [device.kind for device in inventory.devices] == ["cpu"]
    assert "couldn't communicate with the NVIDIA driver" in caplog.text


async def test_a_failure_on_stderr_is_logged(host: dict[str, Path], caplog: pytest.LogCaptureFixture) -> None:
    failure = FakeFailure(
        "Unable to determine the device handle for GPU0000:07:00.0: Unknown Error", 15, True
    )
    install_fake_nvidia_smi(host["nvidia_smi"].parent, [A100_80G], failure=failure)

    with caplog.at_level(logging.WARNING, logger="llmgw.agent.discovery"):
        inventory = await run(host)

    assert inventory.gpus == ()
    assert "Unable to determine the device handle" in caplog.text


async def test_a_hanging_nvidia_smi_times_out_to_no_cards(
    host: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    install_fake_nvidia_smi(host["nvidia_smi"].parent, [A100_80G], hang_seconds=60)

    with caplog.at_level(logging.WARNING, logger="llmgw.agent.discovery"):
        inventory = await run(host, timeout=0.5)

    assert inventory.gpus == ()
    assert "did not answer" in caplog.text


async def test_nvidia_smi_printing_garbage_means_no_cards(
    host: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    script = host["nvidia_smi"]
    script.parent.mkdir()
    script.write_text("#!/bin/sh\necho 'not xml'\n")
    script.chmod(0o755)

    with caplog.at_level(logging.WARNING, logger="llmgw.agent.discovery"):
        inventory = await run(host)

    assert inventory.gpus == ()
    assert "not XML" in caplog.text


async def test_the_cpu_is_a_device_with_the_host_memory(host: dict[str, Path]) -> None:
    inventory = await run(host)

    [cpu] = inventory.devices
    assert (cpu.kind, cpu.index, cpu.device_class) == ("cpu", 0, "cpu")
    assert cpu.name == "AMD EPYC 7763 64-Core Processor"
    assert (cpu.memory_mb, cpu.memory_free_mb) == (64000, 32000)
    assert inventory.memory_mb == 64000
    assert (inventory.node_id, inventory.address) == ("node-1", "10.0.0.7")


async def test_a_cgroup_memory_limit_lowers_the_memory(host: dict[str, Path]) -> None:
    (host["proc_root"] / "self" / "cgroup").write_text("0::/agent.slice\n")
    slice_dir = host["cgroup_root"] / "agent.slice"
    slice_dir.mkdir()
    (slice_dir / "memory.max").write_text(f"{16 * 1024**3}\n")
    (slice_dir / "memory.current").write_text(f"{4 * 1024**3}\n")

    inventory = await run(host)

    assert (inventory.devices[0].memory_mb, inventory.devices[0].memory_free_mb) == (16384, 12288)


async def test_a_cgroup_cpu_quota_lowers_the_cores(host: dict[str, Path]) -> None:
    (host["cgroup_root"] / "cpu.max").write_text("150000 100000\n")

    inventory = await run(host)

    assert inventory.cpu_cores == 2


async def test_without_a_quota_the_cores_are_the_affinity(host: dict[str, Path]) -> None:
    (host["cgroup_root"] / "cpu.max").write_text("max 100000\n")

    inventory = await run(host)

    assert inventory.cpu_cores == len(os.sched_getaffinity(0))


# ---------------------------------------------------------------- pure parsing


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (PROPRIETARY, "550.54.14"),
        (OPEN_MODULE, "580.82.07"),
        ("NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  570.86.15  Release Build\n", "570.86.15"),
        (
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  470.223.02  Sat Oct  7 15:39:11 UTC 2023\n",
            "470.223.02",
        ),
        ("GCC version:  gcc version 12.3.0\n", None),
        ("", None),
    ],
)
def test_parse_driver_version(text: str, expected: str | None) -> None:
    assert parse_driver_version(text) == expected


def test_a_card_without_a_memory_reading_has_none() -> None:
    text = (
        "<nvidia_smi_log><gpu id='00000000:01:00.0'><product_name>NVIDIA A10</product_name>"
        "<uuid>GPU-1</uuid><fb_memory_usage><total>N/A</total><free>N/A</free></fb_memory_usage>"
        "</gpu></nvidia_smi_log>"
    )

    [card] = parse_nvidia_smi_xml(text)

    assert (card.memory_mb, card.memory_free_mb, card.device_class) == (0, 0, "a10")


def test_cards_are_numbered_in_report_order_not_by_minor_number() -> None:
    system = FakeSystem(
        cards=(FakeCard("NVIDIA L4", 23034, minor_number=3), FakeCard("NVIDIA L4", 23034, minor_number=1))
    )

    cards = parse_nvidia_smi_xml(render_xml(system))

    assert [card.index for card in cards] == [0, 1]


def test_a_report_without_cards_has_none() -> None:
    assert parse_nvidia_smi_xml(render_xml(FakeSystem())) == []


@pytest.mark.parametrize(
    ("text", "expected"), [("max 100000", None), ("200000 100000", 2.0), ("50000 100000\n", 0.5), ("", None)]
)
def test_parse_cpu_max(text: str, expected: float | None) -> None:
    assert parse_cpu_max(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"), [("max\n", None), ("1073741824\n", 1 << 30), ("9223372036854771712", None)]
)
def test_parse_memory_max(text: str, expected: int | None) -> None:
    assert parse_memory_max(text) == expected


# ---------------------------------------------------------------- the stand-in itself


def test_the_stand_in_lists_cards_like_nvidia_smi(tmp_path: Path) -> None:
    script = install_fake_nvidia_smi(tmp_path, [H100_80G, A100_80G])

    listing = subprocess.run([script, "-L"], capture_output=True, text=True, check=True).stdout

    [first, second] = listing.splitlines()
    assert re.fullmatch(r"GPU 0: NVIDIA H100 80GB HBM3 \(UUID: GPU-[0-9a-f-]{36}\)", first)
    assert second.startswith("GPU 1: NVIDIA A100-SXM4-80GB (UUID: GPU-")


def test_the_stand_in_refuses_an_unknown_option_like_nvidia_smi(tmp_path: Path) -> None:
    script = install_fake_nvidia_smi(tmp_path, [H100_80G])

    result = subprocess.run([script, "--bogus"], capture_output=True, text=True)

    assert result.returncode == 2
    assert (
        result.stdout.strip()
        == "ERROR: Option --bogus is not recognized. Please run 'nvidia-smi -h' for help."
    )
