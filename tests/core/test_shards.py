"""Shard and replica states, and how a shard's compute reads in the admin API and `ctl replicas`."""

from __future__ import annotations

from llmgw.core.shards import Compute, ReplicaPhase, ShardState


def test_gpus_show_their_indexes_and_the_memory_the_shard_holds() -> None:
    assert Compute(backend="cuda", devices=(0, 1), memory_mb=16000).describe() == "cuda:0,1 16000 MiB"
    assert Compute(backend="cuda", devices=(1100,)).describe() == "cuda:1/mig0"


def test_the_cpu_reads_as_such_and_nothing_reported_as_nothing() -> None:
    assert Compute(backend="cpu").describe() == "cpu"
    assert Compute().describe() == ""


def test_replicas_are_removed_failed_first_and_ready_last() -> None:
    phases = [ReplicaPhase.READY, ReplicaPhase.STARTING, ReplicaPhase.PLACED, ReplicaPhase.ABSENT,
              ReplicaPhase.FAILED]  # fmt: skip
    assert sorted(phases, key=lambda phase: phase.worth) == phases[::-1]
    assert ReplicaPhase.UNKNOWN.worth == ReplicaPhase.STOPPED.worth == ReplicaPhase.FAILED.worth


def test_a_shards_state_puts_its_replica_in_the_phase_of_the_same_name() -> None:
    for state in ShardState:
        assert ReplicaPhase.of_shard(state) == state.value


def test_only_failed_and_stopped_shards_have_ended() -> None:
    assert {state for state in ShardState if state.ended} == {ShardState.FAILED, ShardState.STOPPED}


def test_states_read_as_the_words_the_admin_api_shows() -> None:
    assert ReplicaPhase.READY == "ready" and f"{ReplicaPhase.ABSENT}" == "absent"
