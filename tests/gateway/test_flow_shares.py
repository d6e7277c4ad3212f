"""A process's share of a busy model's slots while other processes' requests wait for it too."""

from __future__ import annotations

import asyncio

from llmgw.core.flowqueue import FlowSettings
from llmgw.gateway import ReplicaEndpoint
from llmgw.gateway.queueing import FlowGate
from llmgw.gateway.replicas import ReplicaTable
from llmgw.testing.eventually import eventually

MODEL = "m"


def two_slots() -> tuple[ReplicaTable, ReplicaEndpoint, FlowGate]:
    table = ReplicaTable()
    endpoint = ReplicaEndpoint("r1", MODEL, "http://127.0.0.1:1", "k", 2, "vllm")
    table.set_ready(endpoint)
    return table, endpoint, FlowGate(FlowSettings(mode="fair", queue_timeout_s=5), table)


async def test_while_others_wait_a_process_keeps_its_share_and_leaves_the_rest_free() -> None:
    table, endpoint, gate = two_slots()
    held = [table.acquire(endpoint), table.acquire(endpoint)]
    turns = [asyncio.create_task(gate.turn(MODEL, "flood", 5)) for _ in range(2)]
    await eventually(lambda: gate.depth().get(MODEL) == 2)
    gate.elsewhere({MODEL: 1})  # one flow waits in another process: half of the two slots is this one's
    assert gate.share(MODEL) == 1
    held.pop().release()  # turns are given at once, in the release: none was
    assert gate.depth()[MODEL] == 2  # it holds its one slot: the freed one is left to the other
    held.pop().release()
    await eventually(lambda: sum(t.done() for t in turns) == 1)
    assert table.free_slots(MODEL) == 2 and gate.depth()[MODEL] == 1
    gate.elsewhere({})  # the other process's queue drained: every free slot is this one's again
    await eventually(lambda: all(t.done() for t in turns))
    assert gate.share(MODEL) is None


async def test_with_nobody_waiting_elsewhere_every_free_slot_goes_to_the_queue() -> None:
    table, endpoint, gate = two_slots()
    held = [table.acquire(endpoint), table.acquire(endpoint)]
    turns = [asyncio.create_task(gate.turn(MODEL, f"flow-{n}", 5)) for n in range(2)]
    await eventually(lambda: gate.depth().get(MODEL) == 2)
    gate.elsewhere({"another-model": 3})
    for lease in held:
        lease.release()
    await eventually(lambda: all(t.done() for t in turns))


async def test_a_share_is_the_slots_times_this_processs_flows_over_all_at_least_one() -> None:
    table, _endpoint, gate = two_slots()
    table.set_ready(ReplicaEndpoint("r2", MODEL, "http://127.0.0.1:2", "k", 2, "vllm"))  # four slots
    held = [table.acquire(e) for e in table.ready(MODEL) for _ in range(2)]  # every slot: what comes queues
    turns = [asyncio.create_task(gate.turn(MODEL, flow, 5)) for flow in ("a", "b", "c")]
    await eventually(lambda: gate.depth().get(MODEL) == 3)
    gate.elsewhere({MODEL: 1})
    assert gate.share(MODEL) == 3  # three flows here, one elsewhere: three of the four slots
    gate.elsewhere({MODEL: 12})
    assert gate.share(MODEL) == 1  # 4 x 3 / 15 rounds to 1
    gate.elsewhere({MODEL: 40})
    assert gate.share(MODEL) == 1  # never none: this process's requests are not starved either
    for turn in turns:
        turn.cancel()
    await asyncio.gather(*turns, return_exceptions=True)
    assert len(held) == 4
