"""The admin API under ``/api``: catalog, keys, nodes, replicas, mirror. Bearer admin token."""

from __future__ import annotations

import hashlib
import hmac
import json
import socket
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import BaseModel, ConfigDict, Field

from llmgw import __version__
from llmgw.controlplane.agentsettings import SettingsCheck, SettingsPush, forbidden_only
from llmgw.controlplane.fleet import Fleet
from llmgw.controlplane.leadership import Leadership
from llmgw.controlplane.reconciling import SERVING_STOPPED, Reconciler
from llmgw.controlplane.settingsapi import add_settings_routes
from llmgw.core.catalog import name_clashes, parse_model
from llmgw.core.health import ComponentHealth
from llmgw.errors import LlmgwError, NoCapacity, NotFound, Unauthorized, ValidationFailed
from llmgw.mirror.blobs import BlobStore
from llmgw.store.database import Store

MAX_BLOB_BYTES = 256 << 30


class KeyRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(min_length=1, max_length=100)
    owner: str = ""


class ServingRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    stopped: bool


def _error(
    status: int, message: str, hint: str = "", problems: list[tuple[str, str]] | None = None
) -> JSONResponse:
    body: dict[str, Any] = {"error": {"message": message, "hint": hint}}
    if problems:
        body["error"]["problems"] = [{"field": f, "problem": p} for f, p in problems]
    return JSONResponse(body, status_code=status)


class AdminApi:
    """Builds the FastAPI app; the routes read the store and the fleet."""

    def __init__(
        self,
        *,
        name: str,
        token_sha256: str,
        store: Store,
        fleet: Fleet,
        reconciler: Reconciler,
        blobs: BlobStore,
        on_keys_changed: Any,
        leadership: Leadership | None = None,
        settings_push: SettingsPush | None = None,
        check_agent_settings: SettingsCheck = forbidden_only,
        components: Callable[[], Sequence[ComponentHealth]] = list,
        vip: str = "",
    ) -> None:
        self.components = components
        """The process supervisor's health list, shown by /api/status."""
        self.settings_push = settings_push
        self.check_agent_settings = check_agent_settings
        self.name = name
        self._token_sha256 = token_sha256
        self.store = store
        self.fleet = fleet
        self.reconciler = reconciler
        self.blobs = blobs
        self.on_keys_changed = on_keys_changed
        self.leadership = leadership
        self.vip = vip
        self.started = time.time()

    def check_token(self, request: Request) -> None:
        header = request.headers.get("authorization", "")
        token = header.removeprefix("Bearer ").strip() if header.startswith("Bearer ") else ""
        digest = hashlib.sha256(token.encode()).hexdigest()
        if not token or not hmac.compare_digest(digest, self._token_sha256):
            raise Unauthorized(
                "missing or wrong admin token",
                "send 'Authorization: Bearer <token>' with the token in admin.token beside server.yaml",
            )

    async def replica_logs(
        self, replica_id: str, lines: int, follow: bool
    ) -> JSONResponse | StreamingResponse:
        replica = self.fleet.replicas.get(replica_id)
        if replica is None:
            raise NotFound(f"no replica {replica_id}", "list them with 'llmgw ctl replicas'")
        node_id = replica.node_id
        node = self.fleet.nodes.get(node_id)
        if node is None:
            raise NoCapacity(
                f"node {node_id}, which runs {replica_id}, is not connected",
                "its log is on the node, in the shard's directory under the agent's work directory",
            )
        channel = node.channel

        def attached() -> bool:
            now = self.fleet.nodes.get(node_id)
            return now is not None and now.channel is channel

        batches = self.fleet.logs.read(channel, replica_id, lines, follow, attached)
        if not follow:
            found = [line async for batch in batches for line in batch]
            return JSONResponse({"replica": replica_id, "node": node_id, "lines": found})
        first = await anext(batches)
        return StreamingResponse(_lines_of(first, batches), media_type="text/plain; charset=utf-8")

    def app(self) -> FastAPI:
        app = FastAPI(
            title="llmgw admin API",
            version=__version__,
            docs_url="/api/docs",
            openapi_url="/api/openapi.json",
            redoc_url=None,
        )
        auth = [Depends(self.check_token)]

        @app.exception_handler(LlmgwError)
        async def _llmgw_error(request: Request, error: LlmgwError) -> JSONResponse:
            problems = error.problems if isinstance(error, ValidationFailed) else None
            return _error(error.status, error.message, error.hint, problems)

        @app.exception_handler(RequestValidationError)
        async def _bad_request(request: Request, error: RequestValidationError) -> JSONResponse:
            problems = []
            for item in error.errors():
                field = ".".join(str(p) for p in item["loc"] if p != "body")
                why = "unknown field; remove it" if item["type"] == "extra_forbidden" else item["msg"]
                problems.append((field, why))
            text = "; ".join(f"{f}: {p}" if f else p for f, p in problems)
            return _error(400, f"invalid request: {text}", "fix the fields named", problems)

        @app.get("/healthz")
        async def healthz() -> dict[str, str]:
            return {"status": "ok"}

        @app.get("/leader")
        async def leader() -> JSONResponse:
            """200 while this control plane leads, 503 otherwise (keepalived's check follows it).

            A leader that cannot reach the store keeps answering 200 ("paused"): it still serves
            from memory, and nobody else can take the lease while the store is away from everyone.
            """
            leading = self.leadership is None or self.leadership.serving
            body = {
                "leader": leading,
                "name": self.name,
                "state": self.leadership.state if self.leadership else "leading",
                "holder": self.leadership.holder if self.leadership else self.name,
            }
            return JSONResponse(body, status_code=200 if leading else 503)

        @app.get("/metrics")
        async def metrics() -> Response:
            return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

        @app.get("/api/status", dependencies=auth)
        async def status() -> dict[str, Any]:
            models = await self.store.models.list()
            replicas = list(self.fleet.replicas.values())
            stopped = bool(await self.store.settings.get(SERVING_STOPPED, False))
            planes = self.leadership.control_planes if self.leadership else []
            leader = self.leadership.holder if self.leadership else self.name
            return {
                "name": self.name,
                "version": __version__,
                "leader": leader,
                "standbys": [p.name for p in planes if p.name != leader],
                "control_planes": [
                    {
                        "name": p.name,
                        "role": "leader" if p.name == leader else "standby",
                        "http": p.http_address,
                        "agents": p.agent_address,
                        "seen_ago_s": round(p.seen_ago_s, 1),
                    }
                    for p in planes
                ],
                "vip": self.vip,
                "vip_on_leader": bool(self.vip) and address_is_local(self.vip),
                "stopped": stopped,
                "uptime_s": int(time.time() - self.started),
                "nodes": len(self.fleet.nodes),
                "models": len(models),
                "replicas": len(replicas),
                "replicas_ready": sum(1 for r in replicas if r.state == "ready"),
                "reconcile_error": self.reconciler.last_error,
                "unplaced": dict(self.reconciler.unplaced),
                "components": [
                    {
                        "name": c.name,
                        "state": str(c.state),
                        "restarts": c.restarts,
                        "last_error": c.last_error,
                        "last_error_at": c.last_error_at,
                    }
                    for c in self.components()
                ],
            }

        @app.put("/api/serving", dependencies=auth)
        async def serving(body: ServingRequest) -> dict[str, Any]:
            """``llmgw stop`` (stopped: true) and ``llmgw start`` (stopped: false)."""
            await self.store.settings.set(SERVING_STOPPED, body.stopped, "admin")
            await self.store.audit.record(
                "admin", "serving.stop" if body.stopped else "serving.start", "serving"
            )
            self.reconciler.stopped = body.stopped
            self.reconciler.wake()
            return {"stopped": body.stopped}

        @app.get("/api/nodes", dependencies=auth)
        async def nodes() -> list[dict[str, Any]]:
            known = {n.id: n for n in await self.store.nodes.list()}
            out = []
            for node_id in sorted(set(known) | set(self.fleet.nodes)):
                live = self.fleet.nodes.get(node_id)
                inv = live.inventory if live else None
                record = known.get(node_id)
                out.append(
                    {
                        "id": node_id,
                        "connected": live is not None,
                        "address": inv.address if inv else (record.address if record else ""),
                        "cpu_cores": inv.cpu_cores if inv else 0,
                        "memory_mb": inv.memory_mb if inv else 0,
                        "gpus": [
                            {
                                "index": d.index,
                                "name": d.name,
                                "class": d.device_class,
                                "memory_mb": d.memory_mb,
                            }
                            for d in (inv.gpus if inv else ())
                        ],
                        "engines": list(live.engines) if live else [],
                        "replicas": sum(1 for r in self.fleet.replicas.values() if r.node_id == node_id),
                    }
                )
            return out

        @app.get("/api/replicas", dependencies=auth)
        async def replicas() -> list[dict[str, Any]]:
            return [
                {
                    "id": r.replica_id,
                    "model": r.model,
                    "node": r.node_id,
                    "state": r.state,
                    "port": r.port,
                    "on": r.compute,
                    "restarts": r.restarts,
                    "error": r.error,
                    "adapters": dict(r.adapter_paths),
                }
                for r in sorted(self.fleet.replicas.values(), key=lambda r: (r.model, r.replica_id))
            ]

        @app.get("/api/replicas/{replica_id}/logs", dependencies=auth, response_model=None)
        async def replica_logs(
            replica_id: str, lines: int = 200, follow: bool = False
        ) -> JSONResponse | StreamingResponse:
            """The replica's engine output: its last lines, then (follow) each new one as plain text."""
            return await self.replica_logs(replica_id, max(0, min(lines, 100_000)), follow)

        @app.get("/api/models", dependencies=auth)
        async def list_models() -> list[dict[str, Any]]:
            out = []
            for record in await self.store.models.list():
                mine = self.fleet.of_model(record.name)
                out.append(
                    {
                        "name": record.name,
                        "definition": record.definition,
                        "replicas": len(mine),
                        "ready": sum(1 for r in mine if r.state == "ready"),
                        "unplaced": self.reconciler.unplaced.get(record.name, ""),
                    }
                )
            return out

        @app.get("/api/models/{name:path}", dependencies=auth)
        async def get_model(name: str) -> dict[str, Any]:
            record = await self.store.models.get(name)
            return {"name": record.name, "definition": record.definition}

        @app.post("/api/models", dependencies=auth, status_code=201)
        async def add_model(request: Request) -> dict[str, Any]:
            model = parse_model(await _json_body(request))
            definition = model.model_dump(mode="json")
            files = _mirror_files(definition)
            missing = [
                (f"{at}.sha256", _not_in_mirror(entry))
                for at, entry in files
                if not self.blobs.has(entry["sha256"])
            ]
            others = []
            for record in await self.store.models.list():
                try:
                    others.append(parse_model(record.definition))
                except ValidationFailed:
                    continue  # the reconciler reports a stored definition it cannot read
            problems = missing + name_clashes(model, others)
            if problems:
                raise ValidationFailed(
                    problems, "import missing files with 'llmgw mirror import FILE'; rename what clashes"
                )
            for _, entry in files:
                if not entry["size"]:
                    entry["size"] = self.blobs.path_of(entry["sha256"]).stat().st_size
            await self.store.models.add(model.name, definition)
            await self.store.audit.record("admin", "model.add", model.name, definition)
            self.reconciler.wake()
            return {"name": model.name, "definition": definition}

        @app.delete("/api/models/{name:path}", dependencies=auth, status_code=204)
        async def remove_model(name: str) -> Response:
            await self.store.models.remove(name)
            await self.store.audit.record("admin", "model.remove", name)
            self.reconciler.wake()
            return Response(status_code=204)

        @app.get("/api/keys", dependencies=auth)
        async def list_keys() -> list[dict[str, Any]]:
            return [
                {
                    "id": k.id,
                    "name": k.name,
                    "prefix": k.prefix,
                    "owner": k.owner,
                    "created_at": k.created_at.isoformat(),
                    "revoked_at": k.revoked_at.isoformat() if k.revoked_at else None,
                }
                for k in await self.store.keys.list(include_revoked=True)
            ]

        @app.post("/api/keys", dependencies=auth, status_code=201)
        async def create_key(body: KeyRequest) -> dict[str, Any]:
            record, secret = await self.store.keys.create(body.name, body.owner)
            await self.store.audit.record("admin", "key.create", record.id, {"name": body.name})
            await self.on_keys_changed()
            return {"id": record.id, "name": record.name, "key": secret}

        @app.delete("/api/keys/{key}", dependencies=auth, status_code=204)
        async def revoke_key(key: str) -> Response:
            await self.store.keys.revoke(key)
            await self.store.audit.record("admin", "key.revoke", key)
            await self.on_keys_changed()
            return Response(status_code=204)

        @app.get("/api/mirror/blobs", dependencies=auth)
        async def list_blobs() -> list[dict[str, Any]]:
            return [
                {"sha256": b.sha256, "size": b.size, "filename": b.filename, "kind": b.kind}
                for b in await self.store.blobs.list()
            ]

        @app.post("/api/mirror/blobs", dependencies=auth, status_code=201)
        async def upload_blob(request: Request, filename: str = "model.gguf") -> dict[str, Any]:
            self.blobs.root.mkdir(parents=True, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=self.blobs.root, prefix=".upload-", delete=True) as handle:
                size = 0
                async for chunk in request.stream():
                    size += len(chunk)
                    if size > MAX_BLOB_BYTES:
                        raise ValidationFailed([("body", "larger than 256 GiB")], "split the upload")
                    handle.write(chunk)
                handle.flush()
                info = await self.blobs.import_file(Path(handle.name))
            await self.store.blobs.add(info.sha256, info.size, filename, "weights")
            await self.store.audit.record("admin", "mirror.import", info.sha256, {"filename": filename})
            return {"sha256": info.sha256, "size": info.size, "filename": filename}

        @app.get("/api/audit", dependencies=auth)
        async def audit(limit: int = 100) -> list[dict[str, Any]]:
            return [
                {
                    "at": a.at.isoformat(),
                    "actor": a.actor,
                    "action": a.action,
                    "target": a.target,
                    "detail": a.detail,
                }
                for a in await self.store.audit.list(limit)
            ]

        add_settings_routes(app, auth, self.store, self.fleet, self.settings_push, self.check_agent_settings)

        @app.api_route("/api/{rest:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH"])
        async def unknown(rest: str) -> JSONResponse:
            raise NotFound(f"no admin route /api/{rest}", "see /api/docs for the routes")

        return app


async def _lines_of(first: list[str], rest: Any) -> Any:
    if first:
        yield "\n".join(first) + "\n"
    async for batch in rest:
        if batch:
            yield "\n".join(batch) + "\n"


async def _json_body(request: Request) -> Any:
    raw = await request.body()
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ValidationFailed([("body", f"not valid JSON: {error}")], "send a JSON object") from None


def address_is_local(address: str) -> bool:
    """Whether ``address`` is on one of this machine's interfaces (a floating address held here)."""
    host = address.split("/")[0]
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.bind((host, 0))
    except OSError:
        return False
    return True


def _not_in_mirror(entry: dict[str, Any]) -> str:
    return f"no {entry['filename'] or 'file'} with sha256 {entry['sha256'][:12]}… in the mirror"


def _mirror_files(definition: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """Every file a dumped model definition takes from the mirror, with its field path.

    The weights, the projector, the repository's other files, each adapter's
    weights and other files: the entries themselves, so their sizes can be filled in.
    """
    source = definition["source"]
    files = [("source", source)]
    if source.get("projector"):
        files.append(("source.projector", source["projector"]))
    files += [(f"source.files.{n}", entry) for n, entry in enumerate(source["files"])]
    for index, adapter in enumerate(definition["adapters"]):
        files.append((f"adapters.{index}", adapter))
        files += [(f"adapters.{index}.files.{n}", entry) for n, entry in enumerate(adapter["files"])]
    return files
