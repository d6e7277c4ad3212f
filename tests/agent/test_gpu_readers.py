"""Both card readers, nvidia-smi and NVML, against fakes built from the same cards."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from llmgw.agent.discovery import choose_source, discover
from llmgw.agent.gpus import GpuSource, devices_of
from llmgw.agent.nvidia_smi import NvidiaSmi, parse_listing, parse_report
from llmgw.agent.nvml import Nvml, open_nvml
from llmgw.core.devices import Device
from llmgw.testing.nvidia_smi_standin import (
    A100_80G_MIG,
    A100_80G_MIG_EMPTY,
    DRIVER_NOT_LOADED,
    H100_80G,
    RTX_4090,
    V100_32G,
    FakeCard,
    FakeLink,
    FakeMig,
    FakeProcess,
    FakeSystem,
    install_fake_nvidia_smi,
    render_list,
    render_xml,
)
from llmgw.testing.nvml_standin import FakeNvml

Reader = Callable[[FakeSystem], GpuSource]


@pytest.fixture(params=["nvidia-smi", "nvml"])
def reader(request: pytest.FixtureRequest, tmp_path: Path) -> Reader:
    """A reader of given cards: llmgw's nvidia-smi code on the fake tool, or its NVML code on the fake."""

    def make(system: FakeSystem) -> GpuSource:
        if request.param == "nvidia-smi":
            script = install_fake_nvidia_smi(
                tmp_path / "bin",
                list(system.cards),
                driver_version=system.driver_version,
                failure=system.failure,
            )
            return NvidiaSmi(str(script))
        library = FakeNvml(system)
        nvml = open_nvml(library)
        assert nvml is not None
        return nvml

    return make


async def devices(reader: Reader, *cards: FakeCard) -> list[Device]:
    report = await reader(FakeSystem(cards)).read()
    assert report is not None
    return devices_of(report)


async def test_whole_cards_are_devices_numbered_by_position_with_their_class(reader: Reader) -> None:
    found = await devices(reader, H100_80G, V100_32G, RTX_4090)

    assert [(d.index, d.device_class, d.mig_profile, d.unavailable) for d in found] == [
        (0, "h100-80g", "", ""),
        (1, "v100-32g", "", ""),
        (2, "rtx4090-24g", "", ""),
    ]


async def test_a_card_in_mig_mode_is_its_instances(reader: Reader) -> None:
    found = await devices(reader, H100_80G, A100_80G_MIG)

    migs = [d for d in found if d.is_mig]
    assert [(d.index, d.device_class, d.memory_mb) for d in migs] == [
        (1100, "a100-80g-mig-3g.40gb", 40192),
        (1101, "a100-80g-mig-2g.20gb", 19968),
        (1102, "a100-80g-mig-1g.10gb", 9728),
    ]
    assert all(d.uuid.startswith("MIG-") for d in migs)
    assert len({d.uuid for d in migs}) == 3
    assert 1 not in [d.index for d in found]


async def test_both_readers_give_each_instance_the_same_uuid(tmp_path: Path) -> None:
    system = FakeSystem((A100_80G_MIG,))
    by_smi = await NvidiaSmi(str(install_fake_nvidia_smi(tmp_path, list(system.cards)))).read()
    library = FakeNvml(system)
    library.nvmlInit()
    by_nvml = await Nvml(library).read()
    assert by_smi is not None and by_nvml is not None

    assert [d.uuid for d in devices_of(by_smi)] == [d.uuid for d in devices_of(by_nvml)]


async def test_instance_memory_and_processes_are_the_instances(reader: Reader) -> None:
    busy = FakeMig(
        "3g.40gb", 40192, gpu_instance_id=2, used_mb=10, processes=(FakeProcess(4242, "python3", 5000),)
    )
    card = FakeCard(
        "NVIDIA A100-SXM4-80GB", 81920, mig_mode="Enabled", mig_devices=(busy, FakeMig("1g.10gb", 9728, 9))
    )
    report = await reader(FakeSystem((card,))).read()
    assert report is not None

    first, second = report.cards[0].instances
    assert (first.memory_free_mb, [p.pid for p in first.processes]) == (40192 - 5010, [4242])
    assert (second.memory_free_mb, second.processes) == (9728, ())


async def test_a_mig_card_with_nothing_carved_stays_out_with_the_fix(reader: Reader) -> None:
    (card,) = await devices(reader, A100_80G_MIG_EMPTY)

    assert card.index == 0 and card.memory_free_mb == 0
    assert "no instance is carved" in card.unavailable
    assert "nvidia-smi mig -i 0 -cgi" in card.unavailable


async def test_mig_cards_give_no_utilisation_rather_than_zero(reader: Reader) -> None:
    report = await reader(FakeSystem((A100_80G_MIG, H100_80G))).read()
    assert report is not None

    assert report.cards[0].utilization_percent is None
    assert report.cards[1].utilization_percent == 0


async def test_readings_are_read(reader: Reader) -> None:
    card = FakeCard(
        "NVIDIA H100 80GB HBM3",
        81559,
        utilization_percent=87,
        memory_util_percent=41,
        sm_clock_mhz=1980,
        ecc_uncorrected=2,
        sram_parity_uncorrected=3,
        temperature_c=71,
        power_draw_w=612.5,
    )
    report = await reader(FakeSystem((card, RTX_4090))).read()
    assert report is not None

    h100, rtx = report.cards
    assert (h100.utilization_percent, h100.memory_bandwidth_percent, h100.sm_clock_mhz) == (87, 41, 1980)
    assert (h100.ecc_uncorrected, h100.temperature_c, h100.power_w) == (2 + 3, 71, 612.5)
    assert rtx.ecc_uncorrected is None


async def test_the_driver_version_comes_with_the_report(reader: Reader) -> None:
    report = await reader(FakeSystem((H100_80G,), driver_version="580.82.07")).read()

    assert report is not None and report.driver_version == "580.82.07"


async def test_nvidia_smi_without_a_loaded_driver_gives_no_report(tmp_path: Path) -> None:
    script = install_fake_nvidia_smi(tmp_path, [H100_80G], failure=DRIVER_NOT_LOADED)

    assert await NvidiaSmi(str(script)).read() is None


def test_nvml_that_does_not_start_is_not_used() -> None:
    library = FakeNvml(FakeSystem((H100_80G,), failure=DRIVER_NOT_LOADED))

    assert open_nvml(library) is None
    assert library.calls == ["nvmlInit"]


async def test_nvlink_error_counters_are_read(reader: Reader) -> None:
    card = FakeCard("NVIDIA H100 80GB HBM3", 81559, nvlinks=(FakeLink(), FakeLink(replay=3, crc_flit=7)))
    errors = await reader(FakeSystem((card, RTX_4090))).nvlink_errors()

    assert errors[0][1]["replay"] == 3
    assert errors[0][0]["replay"] == 0
    assert 1 not in errors


def test_the_listing_names_each_mig_device_profile_and_uuid() -> None:
    listing = render_list(FakeSystem((H100_80G, A100_80G_MIG)))

    names = parse_listing(listing)
    assert sorted(names) == [(1, 0), (1, 1), (1, 2)]
    assert names[(1, 2)][0] == "1g.10gb" and names[(1, 2)][1].startswith("MIG-")


def test_without_the_listing_the_xml_still_gives_instances_and_memory() -> None:
    report = parse_report(render_xml(FakeSystem((A100_80G_MIG,))))

    assert [(i.gpu_instance_id, i.memory_mb, i.multiprocessors) for i in report.cards[0].instances] == [
        (2, 40192, 42),
        (3, 19968, 28),
        (9, 9728, 14),
    ]


def test_choose_source_uses_a_named_nvidia_smi_as_given(tmp_path: Path) -> None:
    script = install_fake_nvidia_smi(tmp_path, [H100_80G])

    source = choose_source(str(script))
    assert isinstance(source, NvidiaSmi) and source.binary == str(script)


async def test_discover_takes_a_reader(tmp_path: Path) -> None:
    library = FakeNvml(FakeSystem((A100_80G_MIG,), driver_version="570.86.15"))
    nvml = open_nvml(library)
    assert nvml is not None

    inventory = await discover("n1", "127.0.0.1", gpus_from=nvml, proc_version=tmp_path / "absent")

    assert [d.index for d in inventory.gpus] == [1000, 1001, 1002]
    assert inventory.driver_version == "570.86.15"
