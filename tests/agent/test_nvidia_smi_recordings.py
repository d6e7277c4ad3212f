"""The nvidia-smi reader on recorded `-q -x` reports of several driver generations; the fake held to them."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

import pytest

from llmgw.agent.nvidia_smi import parse_report
from llmgw.testing.nvidia_smi_standin import A100_80G_MIG, H100_80G, FakeCard, FakeSystem, render_xml

DATA = Path(__file__).parent / "data"


@dataclass(frozen=True)
class Expected:
    driver: str
    name: str
    memory_mb: int
    memory_free_mb: int
    ecc_uncorrected: int | None
    power_w: float | None
    temperature_c: int
    pids: tuple[int, ...]
    instances: int = 0


RECORDINGS = {
    "nvidia-smi-515.105.01-tesla-t4.xml": Expected(
        "515.105.01", "Tesla T4", 15360, 13939, 1, 26.78, 40, (675, 5762)
    ),
    "nvidia-smi-525.125.06-quadro-p2000.xml": Expected(
        "525.125.06", "Quadro P2000", 5120, 5051, None, 4.61, 34, ()
    ),
    "nvidia-smi-535.54.03-a100-mig.xml": Expected(
        "535.54.03", "NVIDIA A100-SXM4-80GB", 81920, 80999, 0, 67.03, 27, (31337,), instances=4
    ),
    "nvidia-smi-570.124.04-rtx-3060.xml": Expected(
        "570.124.04", "NVIDIA GeForce RTX 3060", 12288, 11806, None, 11.63, 42, ()
    ),
    "nvidia-smi-595.84-rtx-4000-ada.xml": Expected(
        "595.84", "NVIDIA RTX 4000 SFF Ada Generation", 20475, 16482, 3, 8.44, 38, (1842, 3190, 4937, 34626)
    ),
}  # fmt: skip


def recorded(name: str) -> str:
    return (DATA / name).read_text()


@pytest.mark.parametrize("name", sorted(RECORDINGS))
def test_each_drivers_report_reads_as_its_cards(name: str) -> None:
    expected = RECORDINGS[name]
    report = parse_report(recorded(name))
    assert report.driver_version == expected.driver
    (card,) = report.cards
    got = Expected(
        report.driver_version,
        card.name,
        card.memory_mb,
        card.memory_free_mb,
        card.ecc_uncorrected,
        card.power_w,
        card.temperature_c or 0,
        tuple(p.pid for p in card.processes),
        len(card.instances),
    )
    assert got == expected


def test_uncorrectable_sram_errors_split_by_kind_on_current_drivers_are_counted() -> None:
    (card,) = parse_report(recorded("nvidia-smi-595.84-rtx-4000-ada.xml")).cards
    assert card.ecc_uncorrected == 2 + 1  # sram_uncorrectable_parity + sram_uncorrectable_secded


def test_an_sram_total_written_beside_its_parts_is_not_counted_twice() -> None:
    text = recorded("nvidia-smi-595.84-rtx-4000-ada.xml").replace(
        "<sram_correctable>0</sram_correctable>",
        "<sram_correctable>0</sram_correctable><sram_uncorrectable>3</sram_uncorrectable>",
        1,
    )
    (card,) = parse_report(text).cards
    assert card.ecc_uncorrected == 3


def test_mig_devices_of_a_recorded_a100_are_its_instances_with_their_processes() -> None:
    (card,) = parse_report(recorded("nvidia-smi-535.54.03-a100-mig.xml")).cards
    assert [(i.gpu_instance_id, i.memory_mb, i.multiprocessors) for i in card.instances] == [
        (3, 19968, 14),
        (4, 19968, 14),
        (5, 19968, 14),
        (6, 19968, 14),
    ]
    assert [[p.pid for p in i.processes] for i in card.instances] == [[], [31337], [], []]


def paths(element: ET.Element, prefix: str = "") -> set[str]:
    """Every element path under ``element`` (``gpu/ecc_errors/volatile/dram_uncorrectable``)."""
    found = set()
    for child in element:
        path = f"{prefix}{child.tag}"
        found.add(path)
        found |= paths(child, path + "/")
    return found


def gpu_paths(text: str) -> set[str]:
    return set.union(*(paths(gpu, "gpu/") for gpu in ET.fromstring(text).findall("gpu")))


NEWEST = "nvidia-smi-595.84-rtx-4000-ada.xml"
MIG = "nvidia-smi-535.54.03-a100-mig.xml"


def test_the_fake_writes_the_ecc_and_power_tags_of_the_newest_recorded_driver() -> None:
    fake = ET.fromstring(render_xml(FakeSystem((H100_80G,))))
    newest = ET.fromstring(recorded(NEWEST))
    for section in ("gpu/ecc_errors/volatile", "gpu/gpu_power_readings"):
        written = {e.tag for e in fake.findall(section + "/*")}
        assert written and written <= {e.tag for e in newest.findall(section + "/*")}, section
    assert {e.tag for e in fake.findall("gpu/ecc_errors/volatile/*")} == {
        e.tag for e in newest.findall("gpu/ecc_errors/volatile/*")
    }


def test_every_element_the_fake_writes_where_the_reader_reads_is_in_a_recording() -> None:
    read_here = ("gpu/mig_devices", "gpu/fb_memory_usage", "gpu/ecc_errors", "gpu/utilization",
                 "gpu/gpu_power_readings", "gpu/processes", "gpu/mig_mode", "gpu/pci/pci_bus_id")  # fmt: skip
    recorded_paths = gpu_paths(recorded(NEWEST)) | gpu_paths(recorded(MIG))
    fake_paths = gpu_paths(render_xml(FakeSystem((H100_80G, A100_80G_MIG))))
    unknown = {p for p in fake_paths if p.startswith(read_here) and p not in recorded_paths}
    assert unknown == set()


def test_the_fakes_report_reads_as_the_cards_it_was_given_sram_errors_included() -> None:
    card = FakeCard(
        "NVIDIA H100 80GB HBM3", 81559, ecc_uncorrected=1, sram_parity_uncorrected=4, power_draw_w=350.0
    )
    (read,) = parse_report(render_xml(FakeSystem((card,)))).cards
    assert (read.ecc_uncorrected, read.power_w) == (5, 350.0)
