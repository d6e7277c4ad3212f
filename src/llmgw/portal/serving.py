"""Serving the portal's files: ``/`` is its page, ``/portal/...`` its scripts and styles.

:class:`Portal` is pure ASGI and stands in front of the admin app: it
answers ``GET``/``HEAD`` of ``/`` and of every file under ``static/`` (read
once, at start, from the installed package: no CDN, no build step) and hands
every other path to the app behind. The files want no token; the pages ask
for one and send it to ``/api`` as ``Authorization: Bearer`` themselves, or
sign in with the organisation's provider and call with the session cookie
(:mod:`llmgw.controlplane.admin.signin`).
Only the files shipped are served (the set is fixed at start, so no path can
reach outside it), each with an ``ETag`` (``304`` when unchanged) and a
content security policy that lets the page load and call nothing but this
origin.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from importlib.resources import files
from importlib.resources.abc import Traversable
from typing import Any

ASGIApp = Callable[
    [dict[str, Any], Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]
]

PREFIX = "/portal/"
"""Where the portal's files are served from (``/`` serves ``index.html``)."""

TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".json": "application/json",
    ".png": "image/png",
    ".ico": "image/x-icon",
}
"""The content type of each kind of file shipped; files of other kinds are not served."""

POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
"""The content security policy of every file: this origin's scripts, styles and /api, nothing else."""


@dataclass(frozen=True)
class Asset:
    """One file as served: its bytes, content type and entity tag."""

    body: bytes
    content_type: str
    etag: str


def _walk(directory: Traversable, prefix: str) -> dict[str, Asset]:
    found: dict[str, Asset] = {}
    for entry in directory.iterdir():
        name = entry.name
        if name.startswith((".", "_")):
            continue
        if entry.is_dir():
            found.update(_walk(entry, f"{prefix}{name}/"))
            continue
        kind = TYPES.get(name[name.rfind(".") :] if "." in name else "")
        if kind is None:
            continue
        body = entry.read_bytes()
        found[prefix + name] = Asset(body, kind, '"' + hashlib.sha256(body).hexdigest()[:32] + '"')
    return found


def shipped_assets() -> dict[str, Asset]:
    """The files in this package's ``static/`` folder, by the path they are served at."""
    assets = _walk(files("llmgw.portal") / "static", PREFIX)
    if PREFIX + "index.html" in assets:
        assets["/"] = assets[PREFIX + "index.html"]
    return assets


def is_portal_path(path: str) -> bool:
    """Whether ``path`` is the portal's (its page or one of its files), never ``/api`` or ``/v1``."""
    return path == "/" or path == PREFIX.rstrip("/") or path.startswith(PREFIX)


def _headers(asset: Asset, length: int) -> list[tuple[bytes, bytes]]:
    return [
        (b"content-type", asset.content_type.encode()),
        (b"content-length", str(length).encode()),
        (b"etag", asset.etag.encode()),
        (b"cache-control", b"no-cache"),
        (b"content-security-policy", POLICY.encode()),
        (b"x-content-type-options", b"nosniff"),
        (b"referrer-policy", b"no-referrer"),
    ]


async def _error(send: Callable[[Any], Awaitable[None]], status: int, message: str, hint: str) -> None:
    body = json.dumps({"error": {"message": message, "hint": hint}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 405:
        headers.append((b"allow", b"GET, HEAD"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class Portal:
    """Pure ASGI: the portal's files, and everything else to ``app``."""

    def __init__(self, app: ASGIApp, assets: Mapping[str, Asset] | None = None) -> None:
        self._app = app
        self.assets = dict(shipped_assets() if assets is None else assets)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not is_portal_path(path):
            await self._app(scope, receive, send)
            return
        if path == PREFIX.rstrip("/"):
            await send({"type": "http.response.start", "status": 308, "headers": [(b"location", b"/")]})
            await send({"type": "http.response.body", "body": b""})
            return
        if scope["method"] not in ("GET", "HEAD"):
            await _error(send, 405, f"{path} is a file of the portal: it answers only GET", "use GET")
            return
        asset = self.assets.get(path)
        if asset is None:
            await _error(send, 404, f"the portal has no file {path}", "open the portal at /")
            return
        if _header(scope, b"if-none-match") == asset.etag:
            await send({"type": "http.response.start", "status": 304, "headers": _headers(asset, 0)[2:]})
            await send({"type": "http.response.body", "body": b""})
            return
        headers = _headers(asset, len(asset.body))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else asset.body})


def _header(scope: dict[str, Any], name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            return str(value.decode("latin-1"))
    return None
