"""Steady traffic for end-to-end fault tests: a thread sending chat requests, one after another.

Each request's start, end and HTTP status (0 when no answer came) are kept,
so a test can say how long after a fault requests succeeded again and which
ones failed. The traffic is bounded: it stops when asked, or after
``max_requests`` or ``max_s``, whichever comes first.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Outcome:
    started: float
    """``time.monotonic()`` when the request was sent."""
    ended: float
    status: int
    """The HTTP status answered; 0 when none came (connection refused, timeout)."""
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status == 200


@dataclass
class Traffic:
    """Chat requests to ``model`` through the gateway at ``url``, ``pause_s`` apart."""

    url: str
    key: str
    model: str
    pause_s: float = 0.1
    timeout_s: float = 60.0
    max_requests: int = 2000
    max_s: float = 300.0
    stream: bool = False
    """Ask for streamed answers (read to their end): a slowed stand-in keeps each one in flight."""
    outcomes: list[Outcome] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> Traffic:
        self._thread = threading.Thread(target=self._run, name=f"traffic-{self.model}", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> list[Outcome]:
        """Stop sending, wait for the request in flight, and return every outcome."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.timeout_s + 5)
        return list(self.outcomes)

    def _run(self) -> None:
        until = time.monotonic() + self.max_s
        while not self._stop.is_set() and len(self.outcomes) < self.max_requests:
            if time.monotonic() > until:
                break
            self.outcomes.append(self.send())
            self._stop.wait(self.pause_s)

    def send(self, max_tokens: int = 8) -> Outcome:
        """One chat request, answered or not."""
        body = {"model": self.model, "messages": [{"role": "user", "content": "Say hello."}]}
        request = urllib.request.Request(
            f"{self.url}/v1/chat/completions",
            data=json.dumps({**body, "max_tokens": max_tokens, "stream": self.stream}).encode(),
            headers={"Authorization": f"Bearer {self.key}", "Content-Type": "application/json"},
        )
        started = time.monotonic()
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as answer:
                text = answer.read()
                if self.stream and not text.rstrip().endswith(b"data: [DONE]"):
                    return Outcome(started, time.monotonic(), 0, "the stream ended before data: [DONE]")
                return Outcome(started, time.monotonic(), answer.status)
        except urllib.error.HTTPError as error:
            return Outcome(started, time.monotonic(), error.code, error.read().decode(errors="replace")[:300])
        except OSError as error:
            return Outcome(started, time.monotonic(), 0, str(error)[:300])

    def recovered_after(self, moment: float) -> float | None:
        """Seconds from ``moment`` to the end of the first request sent after it that succeeded."""
        return next((o.ended - moment for o in list(self.outcomes) if o.started >= moment and o.ok), None)

    def failed_after(self, moment: float) -> list[Outcome]:
        """The requests sent after ``moment`` that failed."""
        return [o for o in list(self.outcomes) if o.started >= moment and not o.ok]
