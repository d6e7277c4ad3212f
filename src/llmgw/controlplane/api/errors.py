"""How the admin API answers an error: ``{"error": {"message", "hint", "problems"?}}``.

Every :class:`~llmgw.errors.LlmgwError` a route raises, every request that
does not validate or whose body does not read (nested too deep, not UTF-8),
every method a route does not take, and any exception nothing else caught (a
500) is answered in that shape (:func:`add_error_handlers`); :func:`declared`
puts the shape into the OpenAPI description of a route.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from llmgw.adminapi.schemas import ErrorBody
from llmgw.core.catalog import one_profile_field
from llmgw.errors import LlmgwError, ValidationFailed

ERROR_CONTENT = {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}

WHY = {
    400: "The request is invalid: each field at fault is named in problems.",
    401: "The token is missing, wrong, expired or revoked.",
    403: "The token's user has no role allowing this here.",
    404: "The thing named does not exist (or no route takes the path).",
    409: "The thing already exists, or is still in use.",
    413: "The upload is larger than allowed, or would pass its owner's quota: nothing of it was kept.",
    503: "Not available now (the store is out of reach, or this control plane does not lead).",
    507: "The disk the mirror writes to is full: nothing of the upload was kept.",
}


def declared(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The ``responses=`` of a route or router answering these error statuses."""
    return {status: {"model": ErrorBody, "description": WHY[status]} for status in statuses}


def error_response(
    status: int,
    message: str,
    hint: str = "",
    problems: list[tuple[str, str]] | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    body: dict[str, Any] = {"error": {"message": message, "hint": hint}}
    if problems:
        body["error"]["problems"] = [{"field": f, "problem": p} for f, p in problems]
    return JSONResponse(body, status_code=status, headers=headers)


def http_error_response(request: Request, error: HTTPException) -> JSONResponse:
    """Starlette's and FastAPI's own refusals in the API's shape: a body that does not read, a method
    the route does not take."""
    if error.status_code == 400 and error.__cause__ is not None:
        why = (
            "nested too deeply to read; nest the JSON less deeply"
            if isinstance(error.__cause__, RecursionError)
            else "could not be read as JSON in UTF-8"
        )
        return error_response(
            400, f"invalid request: body: {why}", "fix the body and send it again", [("body", why)]
        )
    if error.status_code == 405:
        return error_response(
            405,
            f"{request.method} is not allowed on {request.url.path}",
            "see /api/docs for the methods each route takes",
            headers=error.headers,
        )
    if error.status_code == 404:
        return error_response(404, f"no route {request.url.path}", "see /api/docs for the routes")
    return error_response(error.status_code, str(error.detail), "see /api/docs", headers=error.headers)


def unexpected_error_response(error: Exception) -> JSONResponse:
    """An exception nothing else caught: a 500 in the API's shape (the server logs its traceback)."""
    return error_response(
        500,
        f"the control plane failed to answer: {type(error).__name__}",
        "this is a bug in llmgw; report it with the control plane's log around this time",
    )


def request_problems(error: RequestValidationError) -> list[tuple[str, str]]:
    """Each invalid field of a request as ``(field.path, why)``, worded as the catalog words them."""
    problems = []
    for item in error.errors():
        field = ".".join(str(p) for p in item["loc"] if p != "body")
        kind = item["type"]
        if kind == "json_invalid":
            field, why = "body", f"not valid JSON: {item.get('ctx', {}).get('error', item['msg'])}"
        elif kind == "extra_forbidden":
            why = "unknown field; remove it or check its spelling"
        elif kind == "missing":
            why = "required"
        elif kind in ("model_type", "model_attributes_type", "dict_type"):
            why = "must be a JSON object"
        else:
            why = str(item["msg"]).removeprefix("Value error, ")
        problems.append((field, why))
    body = getattr(error, "body", None)
    if isinstance(body, dict) and "profile" in body and "profiles" not in body:
        # A definition with one ``profile`` is read as a list of one: its fields keep its names.
        problems = [(one_profile_field(field), why) for field, why in problems]
    return problems


def add_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(LlmgwError)
    async def _llmgw_error(request: Request, error: LlmgwError) -> JSONResponse:
        problems = error.problems if isinstance(error, ValidationFailed) else None
        return error_response(error.status, error.message, error.hint, problems)

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, error: HTTPException) -> JSONResponse:
        return http_error_response(request, error)

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, error: Exception) -> JSONResponse:
        return unexpected_error_response(error)

    @app.exception_handler(RequestValidationError)
    async def _bad_request(request: Request, error: RequestValidationError) -> JSONResponse:
        problems = request_problems(error)
        text = "; ".join(f"{f}: {p}" if f else p for f, p in problems)
        return error_response(400, f"invalid request: {text}", "fix the fields named", problems)


def describe_400_not_422(app: FastAPI) -> None:
    """Make ``app``'s OpenAPI say what the API answers to an invalid request: 400 (never 422).

    FastAPI declares a 422 on every route with parameters; the handler above answers
    400 in the error shape instead, so the description says so.
    """
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        document = build()
        for methods in document.get("paths", {}).values():
            for operation in methods.values():
                responses = operation.get("responses", {})
                if responses.pop("422", None) is not None and "400" not in responses:
                    responses["400"] = {
                        "description": WHY[400],
                        "content": {
                            "application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}
                        },
                    }
        schemas = document.get("components", {}).get("schemas", {})
        for unused in ("HTTPValidationError", "ValidationError"):
            schemas.pop(unused, None)
        app.openapi_schema = document
        return document

    app.openapi = openapi  # type: ignore[method-assign]
