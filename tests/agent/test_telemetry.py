"""Telemetry: samples per device, foreign processes, the minute's full report, Prometheus."""

from __future__ import annotations

import asyncio
from pathlib import Path

from prometheus_client import generate_latest

from llmgw.agent.nvml import open_nvml
from llmgw.agent.telemetry import Sampler, card_of_pci, descendants, parse_parent_pid, parse_xid_lines
from llmgw.core.telemetry import Telemetry
from llmgw.observability.gpu_metrics import GpuMetrics
from llmgw.testing.clock import FakeClock
from llmgw.testing.nvidia_smi_standin import (
    A100_80G_MIG,
    H100_80G,
    FakeCard,
    FakeLink,
    FakeMig,
    FakeProcess,
    FakeSystem,
)
from llmgw.testing.nvml_standin import FakeNvml

XID_LOG = (
    "[  12.000000] nvidia: loading out-of-tree module taints kernel.\n"
    "[ 5021.118224] NVRM: Xid (PCI:0000:07:00): 79, pid=2231, name=llama-server, "
    "GPU has fallen off the bus.\n"
    "[ 6000.000001] NVRM: Xid (PCI:0000:0f:00): 48, pid='<unknown>', name=<unknown>, An uncorrectable "
    "double bit error (DBE) has been detected on GPU in the framebuffer at partition 6, subpartition 0.\n"
)


class KernelLog:
    def __init__(self, text: str = "") -> None:
        self.text = text

    async def __call__(self) -> str:
        return self.text


def sampler(system: FakeSystem, own: set[int] | None = None, log: KernelLog | None = None) -> Sampler:
    nvml = open_nvml(FakeNvml(system))
    assert nvml is not None
    clock = FakeClock()
    made = Sampler(
        nvml,
        lambda: own or set(),
        kernel_log=log or KernelLog(),
        clock=clock,
        wall_clock=clock.time,
    )
    made.clock = clock
    return made


async def test_each_sample_carries_the_readings_of_each_card() -> None:
    card = FakeCard(
        "NVIDIA H100 80GB HBM3",
        81559,
        used_mb=1200,
        utilization_percent=93,
        memory_util_percent=55,
        sm_clock_mhz=1980,
    )
    telemetry = await sampler(FakeSystem((card,))).sample()
    assert telemetry is not None

    (sample,) = telemetry.samples
    assert (sample.device, sample.device_class, sample.utilization_percent) == (0, "h100-80g", 93)
    assert (sample.memory_bandwidth_percent, sample.sm_clock_mhz, sample.ecc_uncorrected) == (55, 1980, 0)
    assert (sample.memory_total_mb, sample.memory_used_mb) == (81559, 1200)
    assert telemetry.sampled_unix_ms == 1700000000000


async def test_a_mig_instance_has_its_own_memory_and_no_utilisation() -> None:
    telemetry = await sampler(FakeSystem((A100_80G_MIG,))).sample()
    assert telemetry is not None

    assert [s.device for s in telemetry.samples] == [1000, 1001, 1002]
    first = telemetry.samples[0]
    assert first.utilization_percent is None
    assert (first.memory_total_mb, first.memory_used_mb) == (40192, 13)
    assert first.temperature_c is not None and first.ecc_uncorrected is not None


async def test_processes_that_are_not_the_agents_engines_are_reported_per_device() -> None:
    engine = FakeProcess(100, "llama-server", 30000)
    stranger = FakeProcess(200, "python3", 2000)
    card = FakeCard("NVIDIA H100 80GB HBM3", 81559, processes=(engine, stranger))
    mig = FakeMig("1g.10gb", 9728, gpu_instance_id=9, processes=(FakeProcess(300, "jupyter", 500),))
    carved = FakeCard("NVIDIA A100-SXM4-80GB", 81920, mig_mode="Enabled", mig_devices=(mig,))

    telemetry = await sampler(FakeSystem((card, carved)), own={100}).sample()
    assert telemetry is not None

    assert sorted((f.device, f.pid, f.name, f.used_mb) for f in telemetry.foreign) == [
        (0, 200, "python3", 2000),
        (1100, 300, "jupyter", 500),
    ]


async def test_a_foreign_process_that_lets_go_leaves_the_next_sample() -> None:
    stranger = (FakeProcess(200, "python3", 2000),)
    library = FakeNvml(FakeSystem((FakeCard("NVIDIA H100 80GB HBM3", 81559, processes=stranger),)))
    nvml = open_nvml(library)
    assert nvml is not None
    made = Sampler(nvml, kernel_log=KernelLog(), clock=FakeClock())

    held = await made.sample()
    library.cards = FakeSystem((FakeCard("NVIDIA H100 80GB HBM3", 81559),)).numbered()
    released = await made.sample()
    assert held is not None and released is not None

    assert [f.pid for f in held.foreign] == [200]
    assert list(released.foreign) == []


async def test_every_minute_the_sample_is_full_with_nvlink_and_new_xids() -> None:
    card = FakeCard("NVIDIA H100 80GB HBM3", 81559, nvlinks=(FakeLink(replay=4), FakeLink(crc_data=1)))
    log = KernelLog(XID_LOG)
    made = sampler(FakeSystem((card, H100_80G)), log=log)
    clock = made.clock
    assert isinstance(clock, FakeClock)

    first = await made.sample()
    await clock.advance(30.0)
    between = await made.sample()
    await clock.advance(31.0)
    log.text += (
        "[ 7000.5] NVRM: Xid (PCI:0000:07:00): 31, pid=1, name=x, Ch 00000010, intr 10000000. MMU Fault\n"
    )
    minute = await made.sample()
    assert first is not None and between is not None and minute is not None

    assert (first.full, between.full, minute.full) == (True, False, True)
    assert [(x.card, x.xid) for x in first.xids] == [(0, 79), (1, 48)]
    assert list(between.xids) == [] and list(between.nvlink) == []
    assert [(x.card, x.xid) for x in minute.xids] == [(0, 31)]
    assert [(e.card, e.link, e.counters["replay"], e.counters["crc_data"]) for e in minute.nvlink] == [
        (0, 0, 4, 0),
        (0, 1, 0, 1),
    ]


def test_xid_lines_name_the_pci_address_and_the_code() -> None:
    found = parse_xid_lines(XID_LOG)

    assert [(address, xid) for address, xid, _ in found] == [("0000:07:00", 79), ("0000:0f:00", 48)]
    assert found[0][2].endswith("GPU has fallen off the bus.")


async def test_an_xid_of_an_unknown_address_is_kept_with_no_card() -> None:
    report = await open_nvml(FakeNvml(FakeSystem((H100_80G,)))).read()  # type: ignore[union-attr]
    assert report is not None

    assert card_of_pci(report.cards, "0000:07:00") == 0
    assert card_of_pci(report.cards, "0000:99:00") == -1


async def test_prometheus_metrics_are_per_device_and_leave_out_what_is_not_read() -> None:
    telemetry = await sampler(FakeSystem((H100_80G, A100_80G_MIG))).sample()
    assert telemetry is not None
    metrics = GpuMetrics()

    metrics.update("gpu-1", telemetry)
    text = generate_latest(metrics.registry).decode()

    assert 'llmgw_gpu_utilization_ratio{device="0",device_class="h100-80g",node="gpu-1"} 0.0' in text
    assert 'device="1/mig0"' in text
    assert 'llmgw_gpu_utilization_ratio{device="1/mig0"' not in text
    mig = {"node": "gpu-1", "device": "1/mig2", "device_class": "a100-80g-mig-1g.10gb"}
    assert metrics.registry.get_sample_value("llmgw_gpu_memory_total_bytes", mig) == 9728 << 20


async def test_devices_a_node_stops_reporting_leave_the_metrics() -> None:
    metrics = GpuMetrics()
    before = await sampler(FakeSystem((H100_80G, H100_80G))).sample()
    after = await sampler(FakeSystem((H100_80G,))).sample()
    assert before is not None and after is not None

    metrics.update("n", before)
    metrics.update("n", after)
    text = generate_latest(metrics.registry).decode()

    assert 'device="0"' in text and 'device="1"' not in text


def test_the_parent_pid_is_read_past_a_command_with_spaces_and_parentheses() -> None:
    assert parse_parent_pid("4242 (llama (server) x) S 17 4242 4242 0 -1 4194560") == 17
    assert parse_parent_pid("garbage") is None


def test_the_agents_own_processes_are_it_and_everything_below_it(tmp_path: Path) -> None:
    tree = {10: 1, 20: 10, 30: 20, 40: 1, 50: 40}
    for pid, parent in tree.items():
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(f"{pid} (proc {pid}) S {parent} {pid} {pid} 0")
    (tmp_path / "self").mkdir()

    assert descendants(10, tmp_path) == {10, 20, 30}


async def test_the_sampler_publishes_until_cancelled() -> None:
    nvml = open_nvml(FakeNvml(FakeSystem((H100_80G,))))
    assert nvml is not None
    published: list[int] = []
    two = asyncio.Event()

    def publish(telemetry: Telemetry) -> None:
        published.append(len(telemetry.samples))
        if len(published) == 2:
            two.set()

    task = asyncio.create_task(Sampler(nvml, kernel_log=KernelLog()).run(publish, interval_s=0.01))
    await asyncio.wait_for(two.wait(), 10)
    task.cancel()

    assert published[:2] == [1, 1]
