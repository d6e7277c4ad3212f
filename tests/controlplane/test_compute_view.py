"""How a replica's compute reads in the admin API and `ctl replicas` (ON)."""

from __future__ import annotations

from llmgw.controlplane.fleet import describe_compute
from llmgw.protocol import agent_pb2 as pb


def test_gpus_show_their_indexes_and_the_memory_the_shard_holds() -> None:
    two_cards = pb.Compute(backend="cuda", devices=[0, 1], memory_mb=16000)
    assert describe_compute(two_cards) == "cuda:0,1 16000 MiB"
    assert describe_compute(pb.Compute(backend="cuda", devices=[1100])) == "cuda:1100"


def test_the_cpu_reads_as_such_and_nothing_reported_as_nothing() -> None:
    assert describe_compute(pb.Compute(backend="cpu")) == "cpu"
    assert describe_compute(pb.Compute()) == ""
