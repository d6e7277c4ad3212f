"""MIG numbering, labels, classes and the one-instance rule."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmgw.core.mig import (
    Spread,
    device_label,
    is_mig_class,
    mig_class,
    mig_number,
    mig_parts,
    mig_refusal,
    normalise_profile,
    parse_device_label,
    visible_devices,
)


def test_instances_are_numbered_1000_plus_100_per_card_plus_instance() -> None:
    assert [mig_number(0, 0), mig_number(0, 2), mig_number(3, 1)] == [1000, 1002, 1301]


@given(st.integers(0, 63), st.integers(0, 99))
def test_a_number_gives_back_its_card_and_instance(card: int, instance: int) -> None:
    number = mig_number(card, instance)

    assert mig_parts(number) == (card, instance)
    assert parse_device_label(device_label(number)) == number


def test_views_show_cards_as_numbers_and_instances_as_card_slash_mig() -> None:
    assert [device_label(3), device_label(1002), device_label(1301)] == ["3", "0/mig2", "3/mig1"]


def test_a_label_that_names_nothing_is_refused() -> None:
    with pytest.raises(ValueError, match="neither a card"):
        parse_device_label("gpu0")


def test_profiles_are_found_in_nvml_and_listing_names() -> None:
    assert normalise_profile("NVIDIA A100-SXM4-80GB MIG 3g.40gb") == "3g.40gb"
    assert normalise_profile("MIG 1g.10gb+me") == "1g.10gb+me"
    assert normalise_profile("MIG 1c.3g.40gb") == "1c.3g.40gb"
    assert normalise_profile("NVIDIA H100 80GB HBM3") == ""


def test_an_instance_class_joins_the_cards_and_the_profile() -> None:
    assert mig_class("a100-80g", "3g.40gb") == "a100-80g-mig-3g.40gb"
    assert is_mig_class("a100-80g-mig-3g.40gb") and not is_mig_class("a100-80g")


@pytest.mark.parametrize(
    ("spread", "named"),
    [
        (Spread(tp=2), "tp 2"),
        (Spread(pp=2), "pp 2"),
        (Spread(gpus=4), "gpus 4"),
        (Spread(nodes=2), "nodes 2"),
    ],
)
def test_a_replica_over_several_devices_is_refused_on_a_mig_class(spread: Spread, named: str) -> None:
    reason = mig_refusal("a100-80g-mig-3g.40gb", spread)

    assert named in reason
    assert "exactly one instance" in reason and "set tp, pp, gpus and nodes to 1" in reason


def test_one_device_on_mig_and_several_on_whole_cards_are_allowed() -> None:
    assert mig_refusal("a100-80g-mig-3g.40gb", Spread()) == ""
    assert mig_refusal("h100-80g", Spread(tp=8)) == ""


def test_an_engine_on_a_mig_instance_sees_it_by_uuid_and_no_vulkan_device() -> None:
    env = visible_devices((1002,), {1002: "MIG-5f0d7162-e3fa-5174-adbc-d15a512c1572"})

    assert env == {
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES": "MIG-5f0d7162-e3fa-5174-adbc-d15a512c1572",
    }


def test_an_engine_on_whole_cards_sees_them_by_index() -> None:
    env = visible_devices((0, 3), {})

    assert env == {
        "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
        "CUDA_VISIBLE_DEVICES": "0,3",
        "GGML_VK_VISIBLE_DEVICES": "0,3",
    }
    assert visible_devices((), {}) == {}


def test_cuda_numbers_the_cards_in_pci_bus_order_as_nvidia_smi_does_not_fastest_first() -> None:
    assert visible_devices((1,), {})["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"


def test_a_mig_instance_without_its_uuid_or_among_others_is_refused() -> None:
    with pytest.raises(ValueError, match="no MIG UUID"):
        visible_devices((1000,), {})
    with pytest.raises(ValueError, match="exactly one instance"):
        visible_devices((1000, 1), {1000: "MIG-x"})
