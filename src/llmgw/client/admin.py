"""A small client of the admin API for the commands (synchronous: the CLI edge).

Each typed method answers with the models of :mod:`llmgw.adminapi.schemas`,
parsed, so commands read attributes; :meth:`AdminClient.request` stays for
callers that want the plain JSON.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, TypeVar
from urllib.parse import quote, urlencode

from pydantic import JsonValue, TypeAdapter, ValidationError

from llmgw.adminapi.limits import LimitsView
from llmgw.adminapi.schemas import (
    AuditEntry,
    BlobImported,
    BlobRemoved,
    BlobView,
    KeyCreated,
    KeyView,
    MirrorQuotaView,
    ModelEntry,
    ModelView,
    NodeView,
    PlanView,
    PresetView,
    ReplicaLogs,
    ReplicaView,
    RestartAnswer,
    ServingView,
    SettingChange,
    Settings,
    SettingSet,
    SettingView,
    StatusView,
)
from llmgw.adminapi.tenancy import TokenCreated, TokenView, UnitView, UserView, WhoView
from llmgw.adminapi.usage import UsageAnswer
from llmgw.client.targets import resolve_target
from llmgw.errors import Conflict, Forbidden, LlmgwError, NotFound, TooLarge, Unauthorized, ValidationFailed

UPLOAD_CHUNK = 1 << 20

T = TypeVar("T")


_ADAPTERS: dict[Any, TypeAdapter[Any]] = {}


def _adapter(kind: Any) -> TypeAdapter[Any]:
    """A (kept) validator of ``kind``: a model, or a list of them."""
    if kind not in _ADAPTERS:
        _ADAPTERS[kind] = TypeAdapter(kind)
    return _ADAPTERS[kind]


class AdminClient:
    def __init__(self, url: str, token: str, timeout_s: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s

    @classmethod
    def from_environment(
        cls, url: str | None = None, token: str | None = None, config: Path | None = None
    ) -> AdminClient:
        """URL and token from flags, the environment, the client config's context, or server.yaml."""
        target = resolve_target(url, token, server_config=config)
        return cls(target.url, target.token)

    # typed calls

    def status(self) -> StatusView:
        return self._get(StatusView, "/api/status")

    def set_serving(self, stopped: bool) -> ServingView:
        return self._call(ServingView, "PUT", "/api/serving", {"stopped": stopped})

    def nodes(self) -> list[NodeView]:
        return self._get(list[NodeView], "/api/nodes")

    def replicas(self) -> list[ReplicaView]:
        return self._get(list[ReplicaView], "/api/replicas")

    def replica_logs(self, replica_id: str, lines: int) -> ReplicaLogs:
        return self._get(ReplicaLogs, f"/api/replicas/{quote(replica_id)}/logs?lines={lines}")

    def follow_replica_logs(self, replica_id: str, lines: int) -> Iterator[str]:
        return self.stream(f"/api/replicas/{quote(replica_id)}/logs?lines={lines}&follow=true")

    def models(self) -> list[ModelView]:
        return self._get(list[ModelView], "/api/models")

    def model(self, name: str) -> ModelEntry:
        return self._get(ModelEntry, f"/api/models/{quote(name)}")

    def add_model(self, definition: dict[str, Any]) -> ModelEntry:
        return self._call(ModelEntry, "POST", "/api/models", definition)

    def scale_model(self, name: str, replicas: dict[str, Any]) -> ModelEntry:
        return self._call(ModelEntry, "PUT", f"/api/models/{quote(name)}/replicas", replicas)

    def remove_model(self, name: str) -> None:
        self.request("DELETE", f"/api/models/{quote(name)}")

    def plan(self, model: str | None = None) -> list[PlanView]:
        return self._get(list[PlanView], "/api/plan" + (f"?model={quote(model)}" if model else ""))

    def presets(self) -> list[PresetView]:
        return self._get(list[PresetView], "/api/presets")

    def keys(self) -> list[KeyView]:
        return self._get(list[KeyView], "/api/keys")

    def create_key(
        self, name: str, owner: str = "", place: str = "", collections: list[str] | None = None
    ) -> KeyCreated:
        body: dict[str, Any] = {"name": name, "owner": owner} | ({"place": place} if place else {})
        if collections:
            body["collections"] = collections
        return self._call(KeyCreated, "POST", "/api/keys", body)

    # tenancy

    def units(self, kind: str, within: str = "") -> list[UnitView]:
        """``kind``: orgs, teams or projects; ``within``: an org (teams) or ``org/team`` (projects)."""
        query = {"orgs": "", "teams": "org", "projects": "team"}[kind]
        path = f"/api/{kind}" + (f"?{urlencode({query: within})}" if within and query else "")
        return self._get(list[UnitView], path)

    def create_unit(self, kind: str, body: dict[str, str]) -> UnitView:
        return self._call(UnitView, "POST", f"/api/{kind}", body)

    def remove_unit(self, kind: str, path: str) -> None:
        self.request("DELETE", f"/api/{kind}/" + "/".join(quote(p, safe="") for p in path.split("/")))

    def limits(self) -> list[LimitsView]:
        return self._get(list[LimitsView], "/api/limits")

    def limit(self, subject: str) -> LimitsView:
        return self._get(LimitsView, "/api/limits/" + quote(subject, safe="/:"))

    def set_limits(self, subject: str, body: dict[str, Any]) -> LimitsView:
        return self._call(LimitsView, "PUT", "/api/limits/" + quote(subject, safe="/:"), body)

    def remove_limits(self, subject: str) -> None:
        self.request("DELETE", "/api/limits/" + quote(subject, safe="/:"))

    def me(self) -> WhoView:
        return self._get(WhoView, "/api/me")

    def users(self) -> list[UserView]:
        return self._get(list[UserView], "/api/users")

    def create_user(self, name: str) -> UserView:
        return self._call(UserView, "POST", "/api/users", {"name": name})

    def remove_user(self, name: str) -> None:
        self.request("DELETE", f"/api/users/{quote(name, safe='')}")

    def bind_role(self, user: str, role: str, scope: str) -> UserView:
        return self._call(
            UserView, "PUT", f"/api/users/{quote(user, safe='')}/roles", {"role": role, "scope": scope}
        )

    def unbind_role(self, user: str, scope: str) -> None:
        self.request("DELETE", f"/api/users/{quote(user, safe='')}/roles?" + urlencode({"scope": scope}))

    def tokens(self, user: str) -> list[TokenView]:
        return self._get(list[TokenView], f"/api/users/{quote(user, safe='')}/tokens")

    def create_token(self, user: str, name: str, expires_in_s: int | None) -> TokenCreated:
        body: dict[str, Any] = {"name": name} | ({"expires_in_s": expires_in_s} if expires_in_s else {})
        return self._call(TokenCreated, "POST", f"/api/users/{quote(user, safe='')}/tokens", body)

    def revoke_token(self, token_id: str) -> None:
        self.request("DELETE", f"/api/tokens/{quote(token_id, safe='')}")

    def revoke_key(self, key: str) -> None:
        self.request("DELETE", f"/api/keys/{quote(key)}")

    def blobs(self) -> list[BlobView]:
        return self._get(list[BlobView], "/api/mirror/blobs")

    def mirror_quota(self) -> MirrorQuotaView:
        return self._get(MirrorQuotaView, "/api/mirror/quota")

    def remove_blob(self, sha256: str) -> BlobRemoved:
        return self._call(BlobRemoved, "DELETE", f"/api/mirror/blobs/{quote(sha256, safe='')}")

    def upload_blob(
        self, filename: str, data: BinaryIO, length: int, progress: Callable[[int], None] | None = None
    ) -> BlobImported:
        path = "/api/mirror/blobs?" + urlencode({"filename": filename})
        answer = self.request("POST", path, data=data, length=length, progress=progress)
        return self._parse(BlobImported, "POST", path, answer)

    def settings(self) -> dict[str, JsonValue]:
        return self._get(Settings, "/api/settings").root

    def setting(self, key: str) -> SettingView:
        return self._get(SettingView, _setting_path(key))

    def set_setting(self, key: str, value: JsonValue) -> SettingSet:
        return self._call(SettingSet, "PUT", _setting_path(key), {"value": value})

    def unset_setting(self, key: str) -> None:
        self.request("DELETE", _setting_path(key))

    def settings_history(self, key: str | None, limit: int) -> list[SettingChange]:
        query = {"limit": limit} | ({"key": key} if key else {})
        return self._get(list[SettingChange], "/api/settings-history?" + urlencode(query))

    def restart_agents(self, reason: str) -> RestartAnswer:
        return self._call(RestartAnswer, "POST", "/api/agents/restart", {"reason": reason})

    def audit(self, limit: int) -> list[AuditEntry]:
        return self._get(list[AuditEntry], f"/api/audit?limit={limit}")

    def usage(self, query: list[tuple[str, str]]) -> UsageAnswer:
        """``/api/usage`` with these query parameters (``group_by`` repeated)."""
        return self._get(UsageAnswer, "/api/usage?" + urlencode(query))

    def usage_csv(self, query: list[tuple[str, str]]) -> tuple[str, bool]:
        """``/api/usage`` in CSV, and whether lines were left out past the limit."""
        text, headers = self.text("/api/usage?" + urlencode([*query, ("format", "csv")]))
        return text, headers.get("x-llmgw-truncated") == "true"

    def _get(self, kind: type[T], path: str) -> T:
        return self._call(kind, "GET", path)

    def _call(self, kind: type[T], method: str, path: str, body: Any = None) -> T:
        return self._parse(kind, method, path, self.request(method, path, body))

    def _parse(self, kind: type[T], method: str, path: str, answer: Any) -> T:
        try:
            parsed: T = _adapter(kind).validate_python(answer)
        except ValidationError as error:
            raise LlmgwError(
                f"the control plane at {self.url} answered {method} {path.split('?')[0]} with a shape "
                f"this llmgw does not read: {error.errors()[0]['msg']} at "
                f"{'.'.join(str(p) for p in error.errors()[0]['loc']) or 'the top'}",
                "run the same llmgw version here as on the control plane ('llmgw version')",
            ) from None
        return parsed

    # plain JSON

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

    def text(self, path: str) -> tuple[str, dict[str, str]]:
        """A text answer to GET ``path`` (CSV), with its headers (names in lower case)."""
        request = urllib.request.Request(self.url + path, headers={"Authorization": f"Bearer {self.token}"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                headers = {name.lower(): value for name, value in response.headers.items()}
                return response.read().decode("utf-8", errors="replace"), headers
        except urllib.error.HTTPError as error:
            raise _translate(error) from None
        except (urllib.error.URLError, OSError) as error:
            raise LlmgwError(
                f"cannot reach the control plane at {self.url}: {getattr(error, 'reason', error)}",
                "check that it runs ('llmgw up' or 'llmgw server run')",
            ) from None

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


def _setting_path(key: str) -> str:
    return "/api/settings/" + quote(key, safe=".-_")


def _chunks(data: BinaryIO, progress: Callable[[int], None] | None) -> Iterator[bytes]:
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
    if error.code == 403:
        return Forbidden(message, hint)
    if error.code == 404:
        return NotFound(message, hint)
    if error.code == 409:
        return Conflict(message, hint)
    if error.code == 413:
        return TooLarge(message, hint)
    if error.code == 400 and detail.get("problems"):
        return ValidationFailed([(p["field"], p["problem"]) for p in detail["problems"]], hint)
    failure = LlmgwError(message, hint)
    failure.status = error.code
    return failure
