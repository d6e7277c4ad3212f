"""Card classes from product names and memory, and what an inventory offers."""

from __future__ import annotations

import pytest

from llmgw.core.devices import Device, NodeInventory, gpu_class


@pytest.mark.parametrize(
    ("name", "memory_mb", "expected"),
    [
        ("NVIDIA A100-SXM4-80GB", 81920, "a100-80g"),
        ("NVIDIA A100-PCIE-40GB", 40960, "a100-40g"),
        ("NVIDIA A100 80GB PCIe", 81920, "a100-80g"),
        ("NVIDIA H100 80GB HBM3", 81559, "h100-80g"),
        ("NVIDIA H100 NVL", 95830, "h100-94g"),
        ("NVIDIA H200", 143771, "h200-141g"),
        ("NVIDIA B200", 183359, "b200-180g"),
        ("Tesla V100-SXM2-32GB", 32768, "v100-32g"),
        ("Tesla V100-PCIE-16GB", 16160, "v100-16g"),
        ("Tesla T4", 15360, "t4-16g"),
        ("NVIDIA L4", 23034, "l4-24g"),
        ("NVIDIA L40S", 46068, "l40s-48g"),
        ("NVIDIA GeForce RTX 4090", 24564, "rtx4090-24g"),
        ("NVIDIA GeForce RTX 3090 Ti", 24564, "rtx3090ti-24g"),
        ("NVIDIA GeForce RTX 4070 Ti SUPER", 16376, "rtx4070tisuper-16g"),
        ("NVIDIA GeForce GTX 1080 Ti", 11264, "gtx1080ti-11g"),
        ("NVIDIA RTX A6000", 49140, "rtxa6000-48g"),
        ("NVIDIA RTX 6000 Ada Generation", 49140, "rtx6000-48g"),
        ("Quadro RTX 8000", 46080, "rtx8000-48g"),
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", 97887, "rtxpro6000-96g"),
        ("NVIDIA TITAN RTX", 24220, "titanrtx-24g"),
    ],
)
def test_a_card_is_classed_by_model_and_memory(name: str, memory_mb: int, expected: str) -> None:
    assert gpu_class(name, memory_mb) == expected


def test_a_card_larger_than_any_known_size_keeps_its_own_size() -> None:
    assert gpu_class("NVIDIA X900", 300 * 1024) == "x900-300g"


def test_a_card_of_unknown_memory_is_classed_by_model_alone() -> None:
    assert gpu_class("NVIDIA A100-SXM4-80GB", 0) == "a100"


def test_a_nameless_card_is_a_gpu() -> None:
    assert gpu_class("  ", 16384) == "gpu-16g"


def test_an_inventory_lists_its_cards_apart_from_the_cpu() -> None:
    cpu = Device(
        kind="cpu", index=0, name="AMD EPYC 7763", memory_mb=1024, memory_free_mb=512, device_class="cpu"
    )
    card = Device(kind="nvidia", index=0, name="NVIDIA L4", memory_mb=23034, memory_free_mb=23034)
    inventory = NodeInventory(
        node_id="n1", address="10.0.0.1", cpu_cores=8, memory_mb=1024, devices=(cpu, card)
    )

    assert inventory.gpus == (card,)
