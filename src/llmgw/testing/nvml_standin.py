"""A stand-in for NVML (``pynvml`` of ``nvidia-ml-py``) answering from the fake nvidia-smi's cards.

:class:`FakeNvml` has the calls llmgw makes, with NVML's names, arguments,
return shapes (bytes are decoded, as ``nvidia-ml-py`` does) and errors: a
call before ``nvmlInit`` raises ``NVMLError`` (uninitialised), an empty MIG
slot ``NVMLError_NotFound``, a reading the card does not support
(utilisation on a MIG card, ECC on a consumer card) ``NVMLError_NotSupported``,
and a :class:`~llmgw.testing.nvidia_smi_standin.FakeFailure` makes ``nvmlInit``
fail as on a node whose driver is not loaded. Pass it where llmgw takes the
NVML library; the same :class:`~llmgw.testing.nvidia_smi_standin.FakeSystem`
drives both fakes, so their answers agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

from llmgw.testing.nvidia_smi_standin import FakeCard, FakeMig, FakeProcess, FakeSystem

_MIB = 1 << 20
_NO_INSTANCE = 0xFFFFFFFF


class NVMLError(Exception):
    """NVML's error, with its return code as ``value``."""

    def __init__(self, value: int, message: str = "") -> None:
        super().__init__(message or f"NVML error {value}")
        self.value = value


class NVMLError_Uninitialized(NVMLError):
    def __init__(self) -> None:
        super().__init__(1, "Uninitialized")


class NVMLError_NotSupported(NVMLError):
    def __init__(self) -> None:
        super().__init__(3, "Not Supported")


class NVMLError_NotFound(NVMLError):
    def __init__(self) -> None:
        super().__init__(6, "Not Found")


class NVMLError_DriverNotLoaded(NVMLError):
    def __init__(self) -> None:
        super().__init__(9, "Driver Not Loaded")


@dataclass(frozen=True)
class FakeHandle:
    """A device handle: a card, or one of its MIG devices."""

    card: FakeCard
    mig: FakeMig | None = None


class FakeNvml:
    """NVML's call surface over a :class:`FakeSystem`."""

    NVMLError = NVMLError
    NVMLError_NotFound = NVMLError_NotFound
    NVMLError_NotSupported = NVMLError_NotSupported
    NVML_CLOCK_SM = 1
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
    NVML_VOLATILE_ECC = 0
    NVML_DEVICE_MIG_DISABLE = 0
    NVML_DEVICE_MIG_ENABLE = 1
    NVML_TEMPERATURE_GPU = 0
    NVML_NVLINK_MAX_LINKS = 18
    NVML_NVLINK_ERROR_DL_REPLAY = 0
    NVML_NVLINK_ERROR_DL_RECOVERY = 1
    NVML_NVLINK_ERROR_DL_CRC_FLIT = 2
    NVML_NVLINK_ERROR_DL_CRC_DATA = 3

    def __init__(self, system: FakeSystem) -> None:
        self.system = system
        self.cards = system.numbered()
        self.initialized = False
        self.calls: list[str] = []

    def _check(self, call: str) -> None:
        self.calls.append(call)
        if not self.initialized:
            raise NVMLError_Uninitialized()

    # ------------------------------------------------------------ system

    def nvmlInit(self) -> None:
        self.calls.append("nvmlInit")
        if self.system.failure is not None:
            raise NVMLError_DriverNotLoaded()
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self._check("nvmlShutdown")
        self.initialized = False

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check("nvmlSystemGetDriverVersion")
        return self.system.driver_version

    def nvmlSystemGetProcessName(self, pid: int) -> str:
        self._check("nvmlSystemGetProcessName")
        for process in self._all_processes():
            if process.pid == pid:
                return process.name
        raise NVMLError_NotFound()

    def _all_processes(self) -> list[FakeProcess]:
        return [
            p for c in self.cards for p in (*c.processes, *(p for m in c.mig_devices for p in m.processes))
        ]

    # ------------------------------------------------------------ cards

    def nvmlDeviceGetCount(self) -> int:
        self._check("nvmlDeviceGetCount")
        return len(self.cards)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        self._check("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.cards):
            raise NVMLError(2, "Invalid Argument")
        return FakeHandle(self.cards[index])

    def nvmlDeviceGetName(self, handle: FakeHandle) -> str:
        self._check("nvmlDeviceGetName")
        if handle.mig is not None:
            return f"{handle.card.product_name} MIG {handle.mig.profile}"
        return handle.card.product_name

    def nvmlDeviceGetUUID(self, handle: FakeHandle) -> str:
        self._check("nvmlDeviceGetUUID")
        return handle.mig.uuid if handle.mig is not None else handle.card.uuid

    def nvmlDeviceGetPciInfo(self, handle: FakeHandle) -> SimpleNamespace:
        self._check("nvmlDeviceGetPciInfo")
        return SimpleNamespace(busId=handle.card.pci_bus_id)

    def nvmlDeviceGetMemoryInfo(self, handle: FakeHandle) -> SimpleNamespace:
        """Bytes, as NVML gives them: ``total``, ``free``, ``used``."""
        self._check("nvmlDeviceGetMemoryInfo")
        if handle.mig is not None:
            total, used = handle.mig.memory_mb, handle.mig.used_total_mb
        else:
            total, used = handle.card.memory_mb, handle.card.used_total_mb + handle.card.reserved_mb
        free = max(total - used, 0)
        return SimpleNamespace(total=total * _MIB, free=free * _MIB, used=used * _MIB)

    def nvmlDeviceGetUtilizationRates(self, handle: FakeHandle) -> SimpleNamespace:
        self._check("nvmlDeviceGetUtilizationRates")
        if handle.mig is not None or handle.card.mig_enabled:
            raise NVMLError_NotSupported()
        return SimpleNamespace(gpu=handle.card.utilization_percent, memory=handle.card.memory_util_percent)

    def nvmlDeviceGetClockInfo(self, handle: FakeHandle, clock: int) -> int:
        self._check("nvmlDeviceGetClockInfo")
        if clock != self.NVML_CLOCK_SM:
            raise NVMLError_NotSupported()
        return handle.card.sm_clock_mhz

    def nvmlDeviceGetTotalEccErrors(self, handle: FakeHandle, error_type: int, counter_type: int) -> int:
        self._check("nvmlDeviceGetTotalEccErrors")
        if handle.card.ecc_uncorrected is None:
            raise NVMLError_NotSupported()
        if error_type != self.NVML_MEMORY_ERROR_TYPE_UNCORRECTED:
            return 0
        return handle.card.ecc_uncorrected + handle.card.sram_parity_uncorrected  # every memory's count

    def nvmlDeviceGetTemperature(self, handle: FakeHandle, sensor: int) -> int:
        self._check("nvmlDeviceGetTemperature")
        return handle.card.temperature_c

    def nvmlDeviceGetPowerUsage(self, handle: FakeHandle) -> int:
        """Milliwatts."""
        self._check("nvmlDeviceGetPowerUsage")
        return round(handle.card.power_draw_w * 1000)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeHandle) -> list[SimpleNamespace]:
        self._check("nvmlDeviceGetComputeRunningProcesses")
        if handle.mig is not None:
            mig = handle.mig
            return [
                SimpleNamespace(
                    pid=p.pid,
                    usedGpuMemory=p.used_mb * _MIB,
                    gpuInstanceId=mig.gpu_instance_id,
                    computeInstanceId=mig.compute_instance_id,
                )
                for p in mig.processes
                if p.type in ("C", "C+G")
            ]
        return [
            SimpleNamespace(
                pid=p.pid,
                usedGpuMemory=p.used_mb * _MIB,
                gpuInstanceId=_NO_INSTANCE,
                computeInstanceId=_NO_INSTANCE,
            )
            for p in handle.card.processes
            if p.type in ("C", "C+G")
        ]

    # ------------------------------------------------------------ MIG

    def nvmlDeviceGetMigMode(self, handle: FakeHandle) -> list[int]:
        """[current, pending]; NotSupported on a card that cannot do MIG."""
        self._check("nvmlDeviceGetMigMode")
        if handle.card.mig_mode == "N/A":
            raise NVMLError_NotSupported()
        pending = handle.card.mig_pending or handle.card.mig_mode
        return [
            self.NVML_DEVICE_MIG_ENABLE if mode == "Enabled" else self.NVML_DEVICE_MIG_DISABLE
            for mode in (handle.card.mig_mode, pending)
        ]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: FakeHandle) -> int:
        self._check("nvmlDeviceGetMaxMigDeviceCount")
        return 7 if handle.card.mig_mode != "N/A" else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: FakeHandle, index: int) -> FakeHandle:
        self._check("nvmlDeviceGetMigDeviceHandleByIndex")
        if not handle.card.mig_enabled or index >= len(handle.card.mig_devices):
            raise NVMLError_NotFound()
        return FakeHandle(handle.card, handle.card.mig_devices[index])

    def nvmlDeviceGetGpuInstanceId(self, handle: FakeHandle) -> int:
        self._check("nvmlDeviceGetGpuInstanceId")
        if handle.mig is None:
            raise NVMLError(2, "Invalid Argument")
        return handle.mig.gpu_instance_id

    def nvmlDeviceGetComputeInstanceId(self, handle: FakeHandle) -> int:
        self._check("nvmlDeviceGetComputeInstanceId")
        if handle.mig is None:
            raise NVMLError(2, "Invalid Argument")
        return handle.mig.compute_instance_id

    def nvmlDeviceGetAttributes(self, handle: FakeHandle) -> SimpleNamespace:
        self._check("nvmlDeviceGetAttributes")
        if handle.mig is None:
            raise NVMLError_NotSupported()
        return SimpleNamespace(multiprocessorCount=handle.mig.multiprocessors)

    # ------------------------------------------------------------ NVLink

    def nvmlDeviceGetNvLinkState(self, handle: FakeHandle, link: int) -> int:
        self._check("nvmlDeviceGetNvLinkState")
        if link >= len(handle.card.nvlinks):
            raise NVMLError_NotSupported()
        return 1

    def nvmlDeviceGetNvLinkErrorCounter(self, handle: FakeHandle, link: int, counter: int) -> int:
        self._check("nvmlDeviceGetNvLinkErrorCounter")
        if link >= len(handle.card.nvlinks):
            raise NVMLError_NotSupported()
        errors = handle.card.nvlinks[link]
        return (errors.replay, errors.recovery, errors.crc_flit, errors.crc_data)[counter]


__all__ = ["FakeHandle", "FakeNvml", "NVMLError", "NVMLError_NotFound", "NVMLError_NotSupported"]
