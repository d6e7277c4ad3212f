"""A stand-in ``nvidia-smi`` for machines without NVIDIA cards.

:func:`install_fake_nvidia_smi` writes an executable named ``nvidia-smi`` into
a directory, with the cards it reports in ``nvidia-smi.json`` beside it. Put
the directory first on PATH (or pass the script's path where a command name is
taken) and llmgw's real discovery code runs against it. It answers like the
real tool:

- ``-q -x`` (``--query --xml-format``): the XML report, shaped like the real
  one (``<nvidia_smi_log>`` with ``<driver_version>``, ``<cuda_version>``,
  ``<attached_gpus>`` and a ``<gpu id="00000000:07:00.0">`` per card);
  a card in MIG mode lists its ``<mig_devices>`` (index, GPU and compute
  instance ids, ``device_attributes/shared``, ``fb_memory_usage``, no UUID
  and no profile, as many drivers print them) and its processes name the
  instance they run in; ECC counts and power draw under the tags current
  drivers write (``sram_uncorrectable_parity`` and ``_secded``,
  ``instant_power_draw``: the 570 series on, DTD v13), held to the recorded
  reports in ``tests/agent/data``;
- ``-L`` (``--list-gpus``): ``GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-...)``
  and, under a card in MIG mode, ``  MIG 3g.40gb     Device  0: (UUID: MIG-...)``;
- ``nvlink -e``: each link's replay, recovery and CRC error counters;
- ``-q``: a short text report; no arguments: a summary table;
- an unknown option: ``ERROR: Option -z is not recognized. Please run
  'nvidia-smi -h' for help.`` and exit status 2.

A :class:`FakeFailure` makes every call fail the way a broken driver does, and
``hang_seconds`` makes every call hang first, for timeout tests.
"""

from __future__ import annotations

import json
import sys
import time
import uuid
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, replace
from pathlib import Path

SPEC_NAME = "nvidia-smi.json"
"""The file beside the script that says what the fake reports."""


@dataclass(frozen=True)
class FakeProcess:
    """A process holding memory on a card."""

    pid: int
    name: str
    used_mb: int
    type: str = "C"


@dataclass(frozen=True)
class FakeMig:
    """One MIG device carved out of a card."""

    profile: str
    """``3g.40gb``: as ``nvidia-smi -L`` and NVML name it."""
    memory_mb: int
    gpu_instance_id: int
    compute_instance_id: int = 0
    multiprocessors: int = 14
    used_mb: int = 0
    """Memory in use besides the processes'."""
    uuid: str = ""
    processes: tuple[FakeProcess, ...] = ()

    @property
    def used_total_mb(self) -> int:
        return self.used_mb + sum(process.used_mb for process in self.processes)


@dataclass(frozen=True)
class FakeLink:
    """One NVLink's error counters."""

    replay: int = 0
    recovery: int = 0
    crc_flit: int = 0
    crc_data: int = 0


@dataclass(frozen=True)
class FakeCard:
    """One card the fake reports; unset identifiers are made up per position."""

    product_name: str
    memory_mb: int
    """``fb_memory_usage/total`` in MiB, as nvidia-smi reports it."""
    product_brand: str = "NVIDIA"
    architecture: str = "Ampere"
    reserved_mb: int = 0
    """Memory the driver keeps for itself (``fb_memory_usage/reserved``)."""
    used_mb: int = 0
    """Memory in use besides the processes'."""
    uuid: str = ""
    minor_number: int | None = None
    pci_bus_id: str = ""
    mig_mode: str = "Disabled"
    """``Enabled``, ``Disabled``, or ``N/A`` for a card that cannot do MIG."""
    mig_pending: str = ""
    """The mode after the next reset; empty means the same as ``mig_mode``."""
    mig_devices: tuple[FakeMig, ...] = ()
    utilization_percent: int = 0
    memory_util_percent: int = 0
    sm_clock_mhz: int = 1410
    ecc_uncorrected: int | None = 0
    """Volatile uncorrected DRAM ECC errors; None for a card without ECC."""
    sram_parity_uncorrected: int = 0
    """Volatile uncorrected SRAM parity errors (``sram_uncorrectable_parity``), on a card with ECC."""
    temperature_c: int = 34
    power_draw_w: float = 60.0
    power_limit_w: float = 400.0
    processes: tuple[FakeProcess, ...] = ()
    """On a card in MIG mode, put processes on its MIG devices instead."""
    nvlinks: tuple[FakeLink, ...] = ()

    @property
    def mig_enabled(self) -> bool:
        return self.mig_mode == "Enabled"

    @property
    def used_total_mb(self) -> int:
        on_instances = sum(mig.used_total_mb for mig in self.mig_devices) if self.mig_enabled else 0
        return self.used_mb + on_instances + sum(process.used_mb for process in self.processes)

    @property
    def free_mb(self) -> int:
        return max(self.memory_mb - self.reserved_mb - self.used_total_mb, 0)


@dataclass(frozen=True)
class FakeFailure:
    """How every call of a broken ``nvidia-smi`` ends."""

    message: str
    exit_status: int
    to_stderr: bool = False
    """The real tool prints most of its failures on stdout."""


A100_80G = FakeCard(
    "NVIDIA A100-SXM4-80GB", 81920, architecture="Ampere", reserved_mb=566, used_mb=4, power_limit_w=400.0
)
H100_80G = FakeCard(
    "NVIDIA H100 80GB HBM3", 81559, architecture="Hopper", reserved_mb=579, used_mb=1, power_limit_w=700.0
)
V100_32G = FakeCard(
    "Tesla V100-SXM2-32GB",
    32768,
    product_brand="Tesla",
    architecture="Volta",
    reserved_mb=252,
    used_mb=0,
    power_limit_w=300.0,
)
RTX_4090 = FakeCard(
    "NVIDIA GeForce RTX 4090",
    24564,
    product_brand="GeForce",
    architecture="Ada Lovelace",
    reserved_mb=346,
    used_mb=2,
    power_limit_w=450.0,
    mig_mode="N/A",
    ecc_uncorrected=None,
)
A100_80G_MIG = replace(
    A100_80G,
    mig_mode="Enabled",
    mig_devices=(
        FakeMig("3g.40gb", 40192, gpu_instance_id=2, multiprocessors=42, used_mb=13),
        FakeMig("2g.20gb", 19968, gpu_instance_id=3, multiprocessors=28, used_mb=11),
        FakeMig("1g.10gb", 9728, gpu_instance_id=9, multiprocessors=14, used_mb=6),
    ),
)
"""An A100 80GB cut into a 3g.40gb, a 2g.20gb and a 1g.10gb instance."""
A100_80G_MIG_EMPTY = replace(A100_80G, mig_mode="Enabled")
"""An A100 80GB in MIG mode with nothing carved: nothing can run on it."""

DRIVER_NOT_LOADED = FakeFailure(
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running.",
    9,
)
"""What ``nvidia-smi`` says on a node whose kernel module is not loaded."""

_PCI_BUSES = ("07", "0F", "47", "4E", "87", "90", "B7", "BD")
"""Bus numbers of the eight cards in an HGX board, in nvidia-smi's order."""


@dataclass(frozen=True)
class FakeSystem:
    """Everything the fake reports: cards, versions, and how it misbehaves."""

    cards: tuple[FakeCard, ...] = ()
    driver_version: str = "595.84"
    cuda_version: str = "13.2"
    failure: FakeFailure | None = None
    hang_seconds: float = 0.0

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> FakeSystem:
        data = json.loads(text)
        cards = tuple(
            FakeCard(
                **{
                    **card,
                    "processes": tuple(FakeProcess(**p) for p in card["processes"]),
                    "mig_devices": tuple(
                        FakeMig(**{**m, "processes": tuple(FakeProcess(**p) for p in m["processes"])})
                        for m in card["mig_devices"]
                    ),
                    "nvlinks": tuple(FakeLink(**link) for link in card["nvlinks"]),
                }
            )
            for card in data["cards"]
        )
        failure = FakeFailure(**data["failure"]) if data["failure"] else None
        return cls(
            cards=cards,
            driver_version=data["driver_version"],
            cuda_version=data["cuda_version"],
            failure=failure,
            hang_seconds=data["hang_seconds"],
        )

    def numbered(self) -> tuple[FakeCard, ...]:
        """The cards with every identifier filled in, in nvidia-smi's order."""
        filled = []
        for position, card in enumerate(self.cards):
            made_up = uuid.uuid5(uuid.NAMESPACE_URL, f"llmgw-fake-gpu/{position}/{card.product_name}")
            bus = _PCI_BUSES[position] if position < len(_PCI_BUSES) else f"{0xC0 + position:02X}"
            migs = tuple(
                replace(
                    mig,
                    uuid=mig.uuid
                    or f"MIG-{uuid.uuid5(made_up, f'{mig.gpu_instance_id}/{mig.compute_instance_id}')}",
                )
                for mig in card.mig_devices
            )
            filled.append(
                replace(
                    card,
                    uuid=card.uuid or f"GPU-{made_up}",
                    minor_number=position if card.minor_number is None else card.minor_number,
                    pci_bus_id=card.pci_bus_id or f"00000000:{bus}:00.0",
                    mig_pending=card.mig_pending or card.mig_mode,
                    mig_devices=migs,
                )
            )
        return tuple(filled)


def install_fake_nvidia_smi(
    directory: Path,
    cards: list[FakeCard],
    *,
    driver_version: str = "595.84",
    cuda_version: str = "13.2",
    failure: FakeFailure | None = None,
    hang_seconds: float = 0.0,
) -> Path:
    """Write an executable ``nvidia-smi`` reporting ``cards`` into ``directory``; its path."""
    directory.mkdir(parents=True, exist_ok=True)
    system = FakeSystem(tuple(cards), driver_version, cuda_version, failure, hang_seconds)
    (directory / SPEC_NAME).write_text(system.to_json())
    source_root = Path(__file__).resolve().parents[2]
    script = directory / "nvidia-smi"
    script.write_text(
        f"#!{sys.executable}\n"
        "import sys\n"
        "from pathlib import Path\n"
        f"sys.path.insert(0, {str(source_root)!r})\n"
        "from llmgw.testing.nvidia_smi_standin import main\n"
        f"sys.exit(main(sys.argv[1:], Path(__file__).with_name({SPEC_NAME!r})))\n"
    )
    script.chmod(0o755)
    return script


# ---------------------------------------------------------------- what it prints


def render_xml(system: FakeSystem, timestamp: str = "") -> str:
    """The ``nvidia-smi -q -x`` report."""
    root = ET.Element("nvidia_smi_log")
    _text(root, "timestamp", timestamp or time.strftime("%a %b %d %H:%M:%S %Y"))
    _text(root, "driver_version", system.driver_version)
    _text(root, "cuda_version", system.cuda_version)
    cards = system.numbered()
    _text(root, "attached_gpus", str(len(cards)))
    for card in cards:
        _gpu_element(root, card)
    ET.indent(root, space="\t")
    body = ET.tostring(root, encoding="unicode")
    return '<?xml version="1.0" ?>\n<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v13.dtd">\n' + body + "\n"


def _gpu_element(root: ET.Element, card: FakeCard) -> None:
    gpu = ET.SubElement(root, "gpu", id=card.pci_bus_id)
    _text(gpu, "product_name", card.product_name)
    _text(gpu, "product_brand", card.product_brand)
    _text(gpu, "product_architecture", card.architecture)
    _text(gpu, "display_mode", "Disabled")
    _text(gpu, "display_active", "Disabled")
    _text(gpu, "persistence_mode", "Enabled")
    mig = ET.SubElement(gpu, "mig_mode")
    _text(mig, "current_mig", card.mig_mode)
    _text(mig, "pending_mig", card.mig_pending or card.mig_mode)
    if card.mig_enabled and card.mig_devices:
        _mig_devices(gpu, card)
    else:
        _text(gpu, "mig_devices", "None")
    _text(gpu, "accounting_mode", "Disabled")
    _text(gpu, "serial", f"{1320000000000 + (card.minor_number or 0)}")
    _text(gpu, "uuid", card.uuid)
    _text(gpu, "minor_number", str(card.minor_number))
    _text(gpu, "vbios_version", "92.00.45.00.06")
    _text(gpu, "multigpu_board", "No")
    pci = ET.SubElement(gpu, "pci")
    bus = card.pci_bus_id.split(":")[1] if ":" in card.pci_bus_id else "00"
    _text(pci, "pci_bus", bus)
    _text(pci, "pci_device", "00")
    _text(pci, "pci_domain", "0000")
    _text(pci, "pci_bus_id", card.pci_bus_id)
    _text(gpu, "fan_speed", "N/A" if card.product_brand != "GeForce" else "30 %")
    _text(gpu, "performance_state", "P0")
    memory = ET.SubElement(gpu, "fb_memory_usage")
    _text(memory, "total", f"{card.memory_mb} MiB")
    _text(memory, "reserved", f"{card.reserved_mb} MiB")
    _text(memory, "used", f"{card.used_total_mb} MiB")
    _text(memory, "free", f"{card.free_mb} MiB")
    _text(gpu, "compute_mode", "Default")
    utilization = ET.SubElement(gpu, "utilization")
    on_mig = card.mig_enabled
    _text(utilization, "gpu_util", "N/A" if on_mig else f"{card.utilization_percent} %")
    _text(utilization, "memory_util", "N/A" if on_mig else f"{card.memory_util_percent} %")
    _text(utilization, "encoder_util", "N/A" if on_mig else "0 %")
    _text(utilization, "decoder_util", "N/A" if on_mig else "0 %")
    has_ecc = card.ecc_uncorrected is not None
    ecc = ET.SubElement(gpu, "ecc_mode")
    _text(ecc, "current_ecc", "Enabled" if has_ecc else "N/A")
    _text(ecc, "pending_ecc", "Enabled" if has_ecc else "N/A")
    errors = ET.SubElement(gpu, "ecc_errors")
    volatile = ET.SubElement(errors, "volatile")
    counts = {
        "sram_correctable": 0,
        "sram_uncorrectable_parity": card.sram_parity_uncorrected,
        "sram_uncorrectable_secded": 0,
        "dram_correctable": 0,
        "dram_uncorrectable": card.ecc_uncorrected,
    }  # as drivers from the 570 series on write them
    for kind, count in counts.items():
        _text(volatile, kind, str(count) if has_ecc else "N/A")
    temperature = ET.SubElement(gpu, "temperature")
    _text(temperature, "gpu_temp", f"{card.temperature_c} C")
    power = ET.SubElement(gpu, "gpu_power_readings")
    _text(power, "power_state", "P0")
    _text(power, "average_power_draw", f"{card.power_draw_w:.2f} W")
    _text(power, "instant_power_draw", f"{card.power_draw_w:.2f} W")
    _text(power, "current_power_limit", f"{card.power_limit_w:.2f} W")
    clocks = ET.SubElement(gpu, "clocks")
    _text(clocks, "graphics_clock", f"{card.sm_clock_mhz} MHz")
    _text(clocks, "sm_clock", f"{card.sm_clock_mhz} MHz")
    _text(clocks, "mem_clock", "1593 MHz")
    processes = ET.SubElement(gpu, "processes")
    placed: list[tuple[str, str, FakeProcess]] = [("N/A", "N/A", process) for process in card.processes]
    if card.mig_enabled:
        placed += [
            (str(mig.gpu_instance_id), str(mig.compute_instance_id), process)
            for mig in card.mig_devices
            for process in mig.processes
        ]
    for gi, ci, process in placed:
        info = ET.SubElement(processes, "process_info")
        _text(info, "gpu_instance_id", gi)
        _text(info, "compute_instance_id", ci)
        _text(info, "pid", str(process.pid))
        _text(info, "type", process.type)
        _text(info, "process_name", process.name)
        _text(info, "used_memory", f"{process.used_mb} MiB")


def _mig_devices(gpu: ET.Element, card: FakeCard) -> None:
    devices = ET.SubElement(gpu, "mig_devices")
    for position, mig in enumerate(card.mig_devices):
        device = ET.SubElement(devices, "mig_device")
        _text(device, "index", str(position))
        _text(device, "gpu_instance_id", str(mig.gpu_instance_id))
        _text(device, "compute_instance_id", str(mig.compute_instance_id))
        shared = ET.SubElement(ET.SubElement(device, "device_attributes"), "shared")
        _text(shared, "multiprocessor_count", str(mig.multiprocessors))
        _text(shared, "copy_engine_count", str(max(1, mig.multiprocessors // 14)))
        _text(shared, "encoder_count", "0")
        _text(shared, "decoder_count", str(max(0, mig.multiprocessors // 14 - 1)))
        _text(shared, "ofa_count", "0")
        _text(shared, "jpg_count", "0")
        ecc = ET.SubElement(device, "ecc_error_count")
        _text(ET.SubElement(ecc, "volatile_count"), "sram_uncorrectable", "0")
        memory = ET.SubElement(device, "fb_memory_usage")
        _text(memory, "total", f"{mig.memory_mb} MiB")
        _text(memory, "reserved", "0 MiB")
        _text(memory, "used", f"{mig.used_total_mb} MiB")
        _text(memory, "free", f"{max(mig.memory_mb - mig.used_total_mb, 0)} MiB")
        bar1 = ET.SubElement(device, "bar1_memory_usage")
        _text(bar1, "total", "32767 MiB")
        _text(bar1, "used", "0 MiB")
        _text(bar1, "free", "32767 MiB")


def _text(parent: ET.Element, tag: str, value: str) -> ET.Element:
    element = ET.SubElement(parent, tag)
    element.text = value
    return element


def render_list(system: FakeSystem) -> str:
    """The ``nvidia-smi -L`` listing, MIG devices indented under their card."""
    lines = []
    for position, card in enumerate(system.numbered()):
        lines.append(f"GPU {position}: {card.product_name} (UUID: {card.uuid})\n")
        if card.mig_enabled:
            for index, mig in enumerate(card.mig_devices):
                lines.append(f"  MIG {mig.profile:<12} Device {index:>2}: (UUID: {mig.uuid})\n")
    return "".join(lines)


def render_nvlink_errors(system: FakeSystem) -> str:
    """The ``nvidia-smi nvlink -e`` report: each link's error counters under its card."""
    lines = []
    for position, card in enumerate(system.numbered()):
        lines.append(f"GPU {position}: {card.product_name} (UUID: {card.uuid})")
        for number, link in enumerate(card.nvlinks):
            lines += [
                f"\t Link {number}: Replay Errors: {link.replay}",
                f"\t Link {number}: Recovery Errors: {link.recovery}",
                f"\t Link {number}: CRC Errors: {link.crc_flit + link.crc_data}",
            ]
    return "\n".join(lines) + "\n"


def render_text(system: FakeSystem) -> str:
    """A short ``nvidia-smi -q`` text report."""
    lines = [
        "",
        "==============NVSMI LOG==============",
        "",
        f"Timestamp                                 : {time.strftime('%a %b %d %H:%M:%S %Y')}",
        f"Driver Version                            : {system.driver_version}",
        f"CUDA Version                              : {system.cuda_version}",
        "",
        f"Attached GPUs                             : {len(system.cards)}",
    ]
    for card in system.numbered():
        lines += [
            f"GPU {card.pci_bus_id}",
            f"    Product Name                          : {card.product_name}",
            f"    Product Brand                         : {card.product_brand}",
            f"    GPU UUID                              : {card.uuid}",
            f"    Minor Number                          : {card.minor_number}",
            "    FB Memory Usage",
            f"        Total                             : {card.memory_mb} MiB",
            f"        Reserved                          : {card.reserved_mb} MiB",
            f"        Used                              : {card.used_total_mb} MiB",
            f"        Free                              : {card.free_mb} MiB",
            "",
        ]
    return "\n".join(lines) + "\n"


def render_table(system: FakeSystem) -> str:
    """A short version of the summary table plain ``nvidia-smi`` prints."""
    rule = "+" + "-" * 89 + "+"
    header = (
        f"NVIDIA-SMI {system.driver_version}    Driver Version: {system.driver_version}"
        f"    CUDA Version: {system.cuda_version}"
    )
    lines = [rule, f"| {header:<87} |", rule]
    for position, card in enumerate(system.numbered()):
        memory = f"{card.used_total_mb}MiB / {card.memory_mb}MiB"
        row = f"{position:>3}  {card.product_name:<30} {card.pci_bus_id}  {memory}"
        lines.append(f"| {row:<87} |")
    lines.append(rule)
    return "\n".join(lines) + "\n"


_USAGE = (
    "NVIDIA System Management Interface -- v{driver}\n\n"
    "nvidia-smi [OPTION1 [ARG1]] [OPTION2 [ARG2]] ...\n\n"
    "    -h,   --help                Print usage information and exit.\n"
    "    -L,   --list-gpus           Display a list of GPUs connected to the system.\n"
    "    -q,   --query               Display GPU or Unit info.\n"
    "    -x,   --xml-format          Produce XML output.\n"
)
_SHORT = {"--query": "-q", "--xml-format": "-x", "--list-gpus": "-L", "--help": "-h"}


def main(argv: list[str], spec: Path) -> int:
    """Answer one call as ``nvidia-smi`` would; the exit status."""
    system = FakeSystem.from_json(spec.read_text())
    if argv[:1] == ["nvlink"]:
        if argv[1:] not in (["-e"], ["--errorcounters"]):
            print("Invalid combination of input arguments. Please run 'nvidia-smi nvlink -h' for help.")
            return 2
        if system.failure is not None:
            print(system.failure.message)
            return system.failure.exit_status
        sys.stdout.write(render_nvlink_errors(system))
        return 0
    flags = set()
    for arg in argv:
        flag = _SHORT.get(arg, arg)
        if flag not in ("-q", "-x", "-L", "-h"):
            print(f"ERROR: Option {arg} is not recognized. Please run 'nvidia-smi -h' for help.")
            return 2
        flags.add(flag)
    if "-h" in flags:
        print(_USAGE.format(driver=system.driver_version))
        return 0
    if system.hang_seconds:
        time.sleep(system.hang_seconds)
    if system.failure is not None:
        print(system.failure.message, file=sys.stderr if system.failure.to_stderr else sys.stdout)
        return system.failure.exit_status
    if not system.cards:
        print("No devices were found")
        return 6
    if flags == {"-q", "-x"}:
        output = render_xml(system)
    elif flags == {"-q"}:
        output = render_text(system)
    elif flags == {"-L"}:
        output = render_list(system)
    elif not flags:
        output = render_table(system)
    else:
        print("Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.")
        return 2
    sys.stdout.write(output)
    return 0


__all__ = [
    "A100_80G",
    "A100_80G_MIG",
    "A100_80G_MIG_EMPTY",
    "DRIVER_NOT_LOADED",
    "H100_80G",
    "RTX_4090",
    "V100_32G",
    "FakeCard",
    "FakeFailure",
    "FakeLink",
    "FakeMig",
    "FakeProcess",
    "FakeSystem",
    "install_fake_nvidia_smi",
    "main",
    "render_list",
    "render_nvlink_errors",
    "render_xml",
]
