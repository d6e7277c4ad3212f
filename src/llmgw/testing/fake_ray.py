"""A stand-in for Ray's ``ray`` command: ``ray start`` in the foreground, as the Ray launcher runs it.

- ``ray start --head --port P --block``: the cluster's head, listening on P;
  it brings the cards it was given (``CUDA_VISIBLE_DEVICES``), as Ray counts them.
- ``ray start --address HOST:P --block``: joins the head with its own cards;
  it exits (code 1) when the head goes away, as a Ray worker whose head is gone does.

vLLM's stand-in, started with ``--distributed-executor-backend ray`` and
``RAY_ADDRESS``, waits at the head until the cluster holds its tp x pp cards
(:mod:`llmgw.testing.standin_rendezvous`). Without ``--block`` the real command
daemonises; the stand-in refuses it (exit 2), since nothing could supervise it.
"""

from __future__ import annotations

import argparse
import sys
import threading

from llmgw.testing.standin_rendezvous import Cluster, join, visible_cards


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] != ["start"]:
        print("usage: ray start [--head --port P | --address HOST:P] --block", file=sys.stderr)
        return 2
    parser = argparse.ArgumentParser(prog="ray start")
    parser.add_argument("--head", action="store_true")
    parser.add_argument("--port", type=int, default=6379)
    parser.add_argument("--address")
    parser.add_argument("--block", action="store_true")
    parser.add_argument("--node-ip-address")
    parser.add_argument("--num-gpus", type=int)
    options = parser.parse_args(argv[1:])
    if not options.block:
        print("ray start: this stand-in runs in the foreground only: pass --block", file=sys.stderr)
        return 2
    cards = options.num_gpus if options.num_gpus is not None else visible_cards()
    if options.head:
        Cluster(options.port, own=cards)
        print(f"Ray runtime started: head on port {options.port} with {cards} GPU(s)", flush=True)
    elif options.address:
        join(options.address, cards, f"ray node with {cards} GPU(s)")
    else:
        print("ray start: give --head or --address", file=sys.stderr)
        return 2
    threading.Event().wait()  # --block: until a signal ends it
    return 0


if __name__ == "__main__":
    sys.exit(main())
