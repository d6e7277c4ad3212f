"""A stand-in for Ray's ``ray`` command (Ray :data:`IMITATES`): ``ray start`` in the foreground.

It behaves as the recordings of the real one say (tests/engines/data/ray-2.60.0-*.txt,
``make record-ray``; tests/engines/test_ray_standin.py holds it to them):

- ``ray start --head --port P … --block``: the cluster's head, listening on P;
  it brings the cards it was given (``--num-gpus``, else ``CUDA_VISIBLE_DEVICES``).
- ``ray start --address HOST:P … --block``: joins the head with its own cards.
  When the head goes away it does *not* exit at once: as Ray's raylet waits
  ``gcs_rpc_server_reconnect_timeout_s`` (60 s, or ``RAY_gcs_rpc_server_reconnect_timeout_s``,
  which Ray reads too) for the cluster's GCS, it exits with code 1 only that long after
  the head went, printing Ray's "Some Ray subprocesses exited unexpectedly".
- The options llmgw passes (``--node-ip-address``, ``--num-gpus``,
  ``--disable-usage-stats``, ``--include-dashboard``) are taken; an option Ray does not have is
  refused as Ray's parser (click) refuses it (exit 2, "No such option '…'."), and one Ray takes only on
  the head (``--include-dashboard``) is refused on a worker (exit 1), as Ray does.

vLLM's stand-in, started with ``--distributed-executor-backend ray`` and
``RAY_ADDRESS``, waits at the head until the cluster holds its tp x pp cards
(:mod:`llmgw.testing.standin_rendezvous`). Without ``--block`` the real command
daemonises; the stand-in refuses it (exit 2), since nothing could supervise it.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

from llmgw.testing.standin_rendezvous import Cluster, join, visible_cards

IMITATES = "2.60.0"
"""The Ray version whose recordings this stand-in follows."""
GCS_RECONNECT_TIMEOUT_S = 60.0
"""Ray's ``gcs_rpc_server_reconnect_timeout_s``: how long a worker's raylet waits for a lost GCS."""
HEAD_ONLY = ("--include-dashboard",)
"""Options Ray takes on the head only."""


class _ClickLike(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        option = message.rpartition(": ")[2].split()[0] if "unrecognized" in message else ""
        print("Usage: ray start [OPTIONS]\nTry 'ray start --help' for help.\n", file=sys.stderr)
        print(f"Error: No such option '{option}'." if option else f"Error: {message}", file=sys.stderr)
        sys.exit(2)


def parser() -> argparse.ArgumentParser:
    """``ray start``'s options as far as llmgw uses them."""
    options = _ClickLike(prog="ray start", add_help=False)
    options.add_argument("--head", action="store_true")
    options.add_argument("--port", type=int, default=6379)
    options.add_argument("--address")
    options.add_argument("--block", action="store_true")
    options.add_argument("--node-ip-address")
    options.add_argument("--num-gpus", type=int)
    options.add_argument("--disable-usage-stats", action="store_true")
    options.add_argument("--include-dashboard", choices=["true", "false", "True", "False", "1", "0"])
    return options


def _reconnect_timeout_s() -> float:
    return float(os.environ.get("RAY_gcs_rpc_server_reconnect_timeout_s", GCS_RECONNECT_TIMEOUT_S))


def _raylet_gave_up() -> None:
    print(
        "ERR scripts.py -- Some Ray subprocesses exited unexpectedly:\n"
        "ERR scripts.py -- raylet [exit code=1]\n"
        "ERR scripts.py -- Remaining processes will be killed.",
        file=sys.stderr,
        flush=True,
    )
    os._exit(1)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] != ["start"]:
        print("usage: ray start [--head --port P | --address HOST:P] --block", file=sys.stderr)
        return 2
    options = parser().parse_args(argv[1:])
    if not options.head and options.include_dashboard is not None:
        print(
            "PANIC scripts.py -- `--include-dashboard` should only be specified when starting head node "
            "with `--head`.",
            file=sys.stderr,
        )
        return 1
    if not options.block:
        print("ray start: this stand-in runs in the foreground only: pass --block", file=sys.stderr)
        return 2
    cards = options.num_gpus if options.num_gpus is not None else visible_cards()
    if options.head:
        Cluster(options.port, own=cards)
        print(f"Ray runtime started: head on port {options.port} with {cards} GPU(s)", flush=True)
    elif options.address:
        join(options.address, cards, f"ray node with {cards} GPU(s)", on_lost=_lost_head)
    else:
        print("ray start: give --head or --address", file=sys.stderr)
        return 2
    print("This command will now block forever until terminated by a signal.", flush=True)
    threading.Event().wait()  # --block: until a signal ends it
    return 0


def _lost_head() -> None:
    """As Ray's raylet: keep trying the GCS for its reconnect timeout, then give up (exit 1)."""
    time.sleep(_reconnect_timeout_s())
    _raylet_gave_up()


if __name__ == "__main__":
    sys.exit(main())
