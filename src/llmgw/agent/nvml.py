"""Reading the cards through NVML (``nvidia-ml-py``), the library nvidia-smi itself uses.

The library is passed in: production passes the ``pynvml`` module, tests a
stand-in with the same calls. NVML calls block, so each read runs in a thread.
Any call a card does not support (utilisation on a MIG card, ECC on a consumer
card) gives None for that reading, never a failed read.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
from typing import Any

from llmgw.agent.gpus import Card, GpuProcess, GpuReport, MigInstance
from llmgw.core.mig import normalise_profile

log = logging.getLogger(__name__)

_NO_INSTANCE = 0xFFFFFFFF
"""NVML's instance id for a process outside MIG."""
_MIB = 1 << 20
NVLINK_COUNTERS = {
    "replay": "NVML_NVLINK_ERROR_DL_REPLAY",
    "recovery": "NVML_NVLINK_ERROR_DL_RECOVERY",
    "crc_flit": "NVML_NVLINK_ERROR_DL_CRC_FLIT",
    "crc_data": "NVML_NVLINK_ERROR_DL_CRC_DATA",
}
"""The NVLink error counters read, by the name llmgw reports them under."""


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class Nvml:
    """The cards as NVML reports them; ``library`` is ``pynvml`` or a stand-in."""

    name = "nvml"

    def __init__(self, library: Any) -> None:
        self.lib = library

    def _maybe(self, call: str, *args: Any) -> Any:
        """``library.call(*args)``, or None when the card does not support it."""
        return self._call(getattr(self.lib, call), *args)

    def _call(self, function: Any, *args: Any) -> Any:
        try:
            return function(*args)
        except self.lib.NVMLError:
            return None

    def _processes(self, handle: Any) -> tuple[GpuProcess, ...]:
        found = []
        for info in self._maybe("nvmlDeviceGetComputeRunningProcesses", handle) or ():
            gi = getattr(info, "gpuInstanceId", _NO_INSTANCE)
            ci = getattr(info, "computeInstanceId", _NO_INSTANCE)
            used = info.usedGpuMemory
            found.append(
                GpuProcess(
                    pid=int(info.pid),
                    name=_text(self._maybe("nvmlSystemGetProcessName", info.pid) or ""),
                    used_mb=int(used) // _MIB if used is not None else 0,
                    gpu_instance_id=None if gi == _NO_INSTANCE else int(gi),
                    compute_instance_id=None if ci == _NO_INSTANCE else int(ci),
                )
            )
        return tuple(found)

    def _instances(self, handle: Any) -> tuple[MigInstance, ...]:
        instances = []
        for index in range(self.lib.nvmlDeviceGetMaxMigDeviceCount(handle)):
            try:
                mig = self.lib.nvmlDeviceGetMigDeviceHandleByIndex(handle, index)
            except self.lib.NVMLError:
                continue  # an empty slot: NVML answers NOT_FOUND
            memory = self.lib.nvmlDeviceGetMemoryInfo(mig)
            attributes = self._maybe("nvmlDeviceGetAttributes", mig)
            instances.append(
                MigInstance(
                    index=index,
                    uuid=_text(self.lib.nvmlDeviceGetUUID(mig)),
                    profile=normalise_profile(_text(self._maybe("nvmlDeviceGetName", mig) or "")),
                    gpu_instance_id=int(self.lib.nvmlDeviceGetGpuInstanceId(mig)),
                    compute_instance_id=int(self.lib.nvmlDeviceGetComputeInstanceId(mig)),
                    memory_mb=int(memory.total) // _MIB,
                    memory_free_mb=int(memory.free) // _MIB,
                    multiprocessors=int(getattr(attributes, "multiprocessorCount", 0) or 0),
                    processes=self._processes(mig),
                )
            )
        return tuple(instances)

    def _card(self, index: int) -> Card:
        lib = self.lib
        handle = lib.nvmlDeviceGetHandleByIndex(index)
        memory = lib.nvmlDeviceGetMemoryInfo(handle)
        modes = self._maybe("nvmlDeviceGetMigMode", handle)
        current, pending = ("N/A", "N/A")
        if modes is not None:
            current, pending = (
                "Enabled" if mode == lib.NVML_DEVICE_MIG_ENABLE else "Disabled" for mode in modes
            )
        instances = self._instances(handle) if current == "Enabled" else ()
        rates = self._maybe("nvmlDeviceGetUtilizationRates", handle)
        power = self._maybe("nvmlDeviceGetPowerUsage", handle)
        pci = self._maybe("nvmlDeviceGetPciInfo", handle)
        processes = self._processes(handle)
        if instances:
            processes = tuple({p.pid: p for i in instances for p in i.processes}.values()) or processes
        return Card(
            index=index,
            name=_text(lib.nvmlDeviceGetName(handle)),
            uuid=_text(lib.nvmlDeviceGetUUID(handle)),
            memory_mb=int(memory.total) // _MIB,
            memory_free_mb=int(memory.free) // _MIB,
            pci_bus_id=_text(getattr(pci, "busId", "")) if pci is not None else "",
            mig_current=current,
            mig_pending=pending,
            instances=instances,
            processes=processes,
            utilization_percent=None if rates is None else int(rates.gpu),
            memory_bandwidth_percent=None if rates is None else int(rates.memory),
            sm_clock_mhz=self._maybe("nvmlDeviceGetClockInfo", handle, lib.NVML_CLOCK_SM),
            ecc_uncorrected=self._maybe(
                "nvmlDeviceGetTotalEccErrors",
                handle,
                lib.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                lib.NVML_VOLATILE_ECC,
            ),
            temperature_c=self._maybe("nvmlDeviceGetTemperature", handle, lib.NVML_TEMPERATURE_GPU),
            power_w=None if power is None else power / 1000.0,
        )

    def read_now(self) -> GpuReport | None:
        """One blocking read of every card; None when NVML fails."""
        try:
            cards = tuple(self._card(index) for index in range(self.lib.nvmlDeviceGetCount()))
            driver = _text(self.lib.nvmlSystemGetDriverVersion())
        except self.lib.NVMLError as error:
            log.warning(
                "NVML could not read the cards: %s; reporting no NVIDIA cards "
                "(run nvidia-smi by hand and check the driver is loaded)",
                error,
            )
            return None
        return GpuReport(cards=cards, driver_version=driver, reader="nvml")

    async def read(self) -> GpuReport | None:
        return await asyncio.to_thread(self.read_now)

    def nvlink_errors_now(self) -> dict[int, dict[int, dict[str, int]]]:
        found: dict[int, dict[int, dict[str, int]]] = {}
        try:
            count = self.lib.nvmlDeviceGetCount()
        except self.lib.NVMLError:
            return found
        for index in range(count):
            handle = self.lib.nvmlDeviceGetHandleByIndex(index)
            for link in range(self.lib.NVML_NVLINK_MAX_LINKS):
                if not self._maybe("nvmlDeviceGetNvLinkState", handle, link):
                    continue
                counters = {
                    name: self._maybe(
                        "nvmlDeviceGetNvLinkErrorCounter", handle, link, getattr(self.lib, kind)
                    )
                    for name, kind in NVLINK_COUNTERS.items()
                }
                found.setdefault(index, {})[link] = {k: int(v) for k, v in counters.items() if v is not None}
        return found

    async def nvlink_errors(self) -> dict[int, dict[int, dict[str, int]]]:
        return await asyncio.to_thread(self.nvlink_errors_now)


def open_nvml(library: Any = None) -> Nvml | None:
    """NVML when its library loads and ``nvmlInit`` succeeds, else None (use nvidia-smi).

    ``library`` defaults to the ``pynvml`` module of ``nvidia-ml-py``.
    """
    if library is None:
        try:
            library = importlib.import_module("pynvml")
        except ImportError:
            log.debug("nvidia-ml-py is not installed: reading the cards with nvidia-smi")
            return None
    try:
        library.nvmlInit()
    except library.NVMLError as error:
        log.debug("NVML did not start (%s): reading the cards with nvidia-smi", error)
        return None
    except OSError as error:
        log.debug("NVML's library did not load (%s): reading the cards with nvidia-smi", error)
        return None
    return Nvml(library)
