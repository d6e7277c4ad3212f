"""A small client of the admin API for the commands (synchronous: the CLI edge)."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from llmgw.cli.paths import find_server_config
from llmgw.controlplane.config import load_server_config
from llmgw.errors import ConfigError, LlmgwError, NotFound, Unauthorized, ValidationFailed

UPLOAD_CHUNK = 1 << 20


class AdminClient:
    def __init__(self, url: str, token: str, timeout_s: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s

    @classmethod
    def from_environment(
        cls, url: str | None = None, token: str | None = None, config: Path | None = None
    ) -> AdminClient:
        """URL and token from flags, then ``LLMGW_URL``/``LLMGW_ADMIN_TOKEN``, then server.yaml."""
        url = url or os.environ.get("LLMGW_URL")
        token = token or os.environ.get("LLMGW_ADMIN_TOKEN")
        if not (url and token):
            path = config or find_server_config()
            if path is None:
                raise ConfigError(
                    "no control plane to talk to",
                    "pass --url and --token, set LLMGW_URL and LLMGW_ADMIN_TOKEN, or run 'llmgw up'",
                )
            loaded = load_server_config(path)
            host = "127.0.0.1" if loaded.http.host in ("0.0.0.0", "") else loaded.http.host
            url = url or f"http://{host}:{loaded.http.port}"
            if not token:
                try:
                    token = (path.parent / "admin.token").read_text().strip()
                except OSError as error:
                    raise ConfigError(
                        f"cannot read the admin token beside {path}: {error.strerror}",
                        "set LLMGW_ADMIN_TOKEN or run as a user who can read it",
                    ) from None
        return cls(url, token)

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        data: BinaryIO | None = None,
        length: int = 0,
        progress: Callable[[int], None] | None = None,
    ) -> Any:
        headers = {"Authorization": f"Bearer {self.token}"}
        payload: Any = None
        if body is not None:
            payload = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        elif data is not None:
            headers["Content-Type"] = "application/octet-stream"
            headers["Content-Length"] = str(length)
            payload = _chunks(data, progress)
        request = urllib.request.Request(self.url + path, data=payload, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                raw = response.read()
        except urllib.error.HTTPError as error:
            raise _translate(error) from None
        except (urllib.error.URLError, OSError) as error:
            reason = getattr(error, "reason", error)
            raise LlmgwError(
                f"cannot reach the control plane at {self.url}: {reason}",
                "check that it runs ('llmgw up' or 'llmgw server run')",
            ) from None
        return json.loads(raw) if raw else None

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def stream(self, path: str) -> Iterator[str]:
        """The lines of a streamed text answer as they arrive (no timeout once it has begun)."""
        request = urllib.request.Request(self.url + path, headers={"Authorization": f"Bearer {self.token}"})
        try:
            response = urllib.request.urlopen(request)  # no timeout: a quiet log may say nothing for long
        except urllib.error.HTTPError as error:
            raise _translate(error) from None
        except (urllib.error.URLError, OSError) as error:
            raise LlmgwError(
                f"cannot reach the control plane at {self.url}: {getattr(error, 'reason', error)}",
                "check that it runs ('llmgw up' or 'llmgw server run')",
            ) from None
        with response:
            for raw in response:
                yield raw.decode(errors="replace").rstrip("\n")


def _chunks(data: BinaryIO, progress: Callable[[int], None] | None):  # type: ignore[no-untyped-def]
    while chunk := data.read(UPLOAD_CHUNK):
        if progress:
            progress(len(chunk))
        yield chunk


def _translate(error: urllib.error.HTTPError) -> LlmgwError:
    try:
        detail = json.loads(error.read()).get("error", {})
    except (ValueError, AttributeError):
        detail = {}
    message = detail.get("message") or f"HTTP {error.code}"
    hint = detail.get("hint", "")
    if error.code == 401:
        return Unauthorized(message, hint)
    if error.code == 404:
        return NotFound(message, hint)
    if error.code == 400 and detail.get("problems"):
        return ValidationFailed([(p["field"], p["problem"]) for p in detail["problems"]], hint)
    failure = LlmgwError(message, hint)
    failure.status = error.code
    return failure
