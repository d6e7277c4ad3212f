"""``llmgw up`` stops on SIGINT even where it started with SIGINT ignored."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from llmgw.cli.up import STOP_SIGNALS

PROGRAM = """
import os, signal, sys, threading
from llmgw.cli.up import stop_on_signals
assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN, "started with SIGINT ignored"
stop_on_signals()
try:
    print("ready", flush=True)
    threading.Event().wait(60)
except KeyboardInterrupt:
    print("stopping", flush=True)
    sys.exit(0)
sys.exit(3)
"""


def _ignoring_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@pytest.mark.parametrize("signum", STOP_SIGNALS, ids=lambda s: signal.Signals(s).name)
def test_up_stops_on_each_stop_signal_though_it_started_with_sigint_ignored(signum: int) -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", PROGRAM], stdout=subprocess.PIPE, text=True, preexec_fn=_ignoring_sigint
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "ready"
    child.send_signal(signum)
    assert child.wait(30) == 0
    assert child.stdout.read().strip() == "stopping"
