"""OpenAI's Files API on ``/v1/files``: upload, list, retrieve, content, delete, as the openai SDK calls them.

::

    POST   /v1/files                multipart: file, purpose (batch | user_data), expires_after?
    GET    /v1/files                ?purpose=&after=&limit=&order=  {object: list, data, has_more …}
    GET    /v1/files/{id}           the FileObject
    GET    /v1/files/{id}/content   the file's bytes
    DELETE /v1/files/{id}           {id, object: file, deleted: true}

A file belongs to the place of the key that uploaded it (a batch's output
and errors, to the batch's): every key of that place reads it, any other
answers 404 as for an id never made. The gateway keeps no file itself: it
asks a :class:`FileBook` (the control plane's: rows in the store, bytes in
the mirror, ``controlplane/serving/filebook.py``), so any plane or worker
answers for a file any other took.

The files a workflow made (a picture's ``url``, a job's files:
:class:`~llmgw.gateway.files.FileStore`) are read here too, by the key that
made them: ``GET /v1/files/{id}`` (their URL) and ``/content`` answer their
bytes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Protocol

from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException
from starlette.requests import ClientDisconnect, Request
from starlette.types import Receive, Scope, Send

from llmgw.core.filenames import filename_problem
from llmgw.gateway.api_errors import ApiError, allow_only, send_bytes
from llmgw.gateway.exchange import CLIENT_CLOSED, Exchange, send_json
from llmgw.gateway.files import FileStore, StoredFile, content_disposition, content_type
from llmgw.gateway.keys import KeyEntry
from llmgw.gateway.listing import list_page, page_limit, query_params

FILES = "/v1/files"
PURPOSES = ("batch", "user_data")
"""What a client may upload a file for."""
LIST_LIMIT = 10_000
"""Most files one list page gives (OpenAI's bound and default)."""
FORM_SLACK = 64 * 1024
"""Bytes a multipart body may carry beyond its file (the other fields, the parts' headers)."""
FIELD_BYTES = 4096
"""Longest a form field other than the file may be."""
EXPIRES_MIN_S = 3600
EXPIRES_MAX_S = 30 * 24 * 3600
"""``expires_after[seconds]``'s bounds (OpenAI's)."""
READ_CHUNK = 1 << 20


def file_route(path: str) -> bool:
    return path == FILES or path.startswith(FILES + "/")


class FileBook(Protocol):
    """Where files are kept (the control plane implements it on the store and the mirror)."""

    max_bytes: int
    """Largest file it takes."""

    async def add(
        self,
        key: KeyEntry,
        purpose: str,
        filename: str,
        chunks: AsyncIterator[bytes],
        expires_s: float | None,
    ) -> dict[str, Any]:
        """Keep the bytes for ``key``'s place; the FileObject. ApiError (4xx) for a file too large,
        a place over its bytes, or a ``batch`` file that is not a batch's input."""
        ...

    async def get(self, key: KeyEntry, file_id: str) -> dict[str, Any] | None:
        """The FileObject when the file is of ``key``'s place; None otherwise."""
        ...

    async def list(
        self, key: KeyEntry, *, purpose: str | None, after: str | None, limit: int, newest_first: bool
    ) -> tuple[list[dict[str, Any]], bool]:
        """The place's FileObjects in order from the one after ``after``, and whether more follow."""
        ...

    async def content(
        self, key: KeyEntry, file_id: str
    ) -> tuple[dict[str, Any], AsyncIterator[bytes]] | None:
        """The FileObject and its bytes when the file is of ``key``'s place; None otherwise."""
        ...

    async def delete(self, key: KeyEntry, file_id: str) -> bool:
        """Delete the file when it is of ``key``'s place; whether it was."""
        ...


def _invalid(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, "invalid_request", param)


def _not_found(file_id: str) -> ApiError:
    return ApiError(
        404,
        f"No such File object: '{file_id}' (GET /v1/files lists the files of your key's place).",
        "file_not_found",
        "file_id",
    )


def list_options(query: dict[str, str]) -> tuple[str | None, str | None, int, bool]:
    """Purpose, after, limit and order of a list request; 400 naming a bad one."""
    limit = page_limit(query, most=LIST_LIMIT, default=LIST_LIMIT)
    order = query.get("order", "desc")
    if order not in ("asc", "desc"):
        raise _invalid("'order' must be 'asc' or 'desc'.", "order")
    return query.get("purpose") or None, query.get("after") or None, limit, order == "desc"


def expires_s(form: Any, purpose: str) -> float | None:
    """The seconds ``expires_after`` asks for (None: the purpose's own rule); 400 when it is wrong."""
    anchor, seconds = form.get("expires_after[anchor]"), form.get("expires_after[seconds]")
    if anchor is None and seconds is None:
        return None
    if anchor != "created_at":
        raise _invalid("'expires_after[anchor]' must be 'created_at'.", "expires_after")
    try:
        value = int(str(seconds))
    except ValueError:
        value = 0
    if not EXPIRES_MIN_S <= value <= EXPIRES_MAX_S:
        raise _invalid(
            f"'expires_after[seconds]' must be a whole number from {EXPIRES_MIN_S} to {EXPIRES_MAX_S}.",
            "expires_after",
        )
    return float(value)


async def _chunks(upload: UploadFile) -> AsyncIterator[bytes]:
    while chunk := await upload.read(READ_CHUNK):
        yield chunk


class FileRoutes:
    """``/v1/files``: each request's key checked, then asked of the :class:`FileBook` (or, for a
    workflow's file, of the gateway's :class:`FileStore`)."""

    def __init__(self, book: FileBook | None, made: FileStore) -> None:
        self.book = book
        self.made = made

    def _book(self) -> FileBook:
        if self.book is None:
            raise ApiError(
                404,
                "This gateway keeps no uploaded files: send /v1/files to a control plane.",
                "unknown_url",
            )
        return self.book

    async def serve(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        exchange: Exchange,
        path: str,
        key: KeyEntry,
        length: bytes | None,
    ) -> None:
        method: str = scope["method"]
        rest = path[len(FILES) :].strip("/")
        if not rest:
            allow_only(method, path, "GET", "POST")
            if method == "POST":
                await self._upload(scope, receive, send, exchange, key, length)
                return
            purpose, after, limit, newest_first = list_options(query_params(scope.get("query_string", b"")))
            files, more = await self._book().list(
                key, purpose=purpose, after=after, limit=limit, newest_first=newest_first
            )
            await send_json(send, exchange, 200, list_page(files, more))
            return
        file_id, _, action = rest.partition("/")
        if action not in ("", "content"):
            raise ApiError(404, f"Invalid URL ({method} {path}).", "unknown_url")
        made = self.made.get(file_id, key.key_id)
        if action == "content":
            allow_only(method, path, "GET")
            if made is not None:
                await _send_made(send, exchange, made)
                return
            found = None if self.book is None else await self.book.content(key, file_id)
            if found is None:
                raise _not_found(file_id)
            await _send_content(send, exchange, *found)
            return
        allow_only(method, path, "GET", "DELETE")
        if made is not None and method == "GET":  # a workflow's file: its URL answers its bytes
            await _send_made(send, exchange, made)
            return
        if method == "DELETE":
            if self.book is None or not await self.book.delete(key, file_id):
                raise _not_found(file_id)
            await send_json(send, exchange, 200, {"id": file_id, "object": "file", "deleted": True})
            return
        shown = None if self.book is None else await self.book.get(key, file_id)
        if shown is None:
            raise _not_found(file_id)
        await send_json(send, exchange, 200, shown)

    async def _upload(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        exchange: Exchange,
        key: KeyEntry,
        length: bytes | None,
    ) -> None:
        book = self._book()
        if length is None or not length.isdigit():
            raise ApiError(
                411,
                "Send the upload with a Content-Length (as multipart/form-data with 'file' and 'purpose').",
                "invalid_request",
            )
        if int(length) > book.max_bytes + FORM_SLACK:
            raise ApiError(
                413,
                f"The file is larger than the {book.max_bytes} bytes a file may have here; split it.",
                "file_too_large",
                "file",
            )
        request = Request(scope, receive)
        if not request.headers.get("content-type", "").startswith("multipart/form-data"):
            raise _invalid("Upload the file as multipart/form-data with the fields 'file' and 'purpose'.")
        try:
            form = await request.form(max_files=1, max_fields=8, max_part_size=FIELD_BYTES)
        except ClientDisconnect:
            exchange.status = CLIENT_CLOSED
            return
        except MultiPartException as error:
            raise _invalid(f"The multipart body cannot be read: {error.message}.") from error
        try:
            upload = form.get("file")
            if not isinstance(upload, UploadFile):
                raise _invalid("The form has no 'file': attach the file's bytes as the field 'file'.", "file")
            purpose = form.get("purpose")
            if purpose not in PURPOSES:
                raise _invalid(f"'purpose' must be one of {', '.join(PURPOSES)}.", "purpose")
            filename = upload.filename or "file"
            problem = filename_problem(filename)
            if problem:
                raise _invalid(f"The file's name {problem}.", "file")
            created = await book.add(
                key, str(purpose), filename, _chunks(upload), expires_s(form, str(purpose))
            )
        finally:
            await form.close()
        await send_json(send, exchange, 200, created)


async def _send_made(send: Send, exchange: Exchange, stored: StoredFile) -> None:
    exchange.status, exchange.response_started = 200, True
    disposition = content_disposition(stored.filename)
    await send_bytes(
        send,
        200,
        stored.data,
        exchange.request_id,
        stored.content_type.encode(),
        [(b"content-disposition", disposition)],
    )


async def _send_content(
    send: Send, exchange: Exchange, shown: dict[str, Any], chunks: AsyncIterator[bytes]
) -> None:
    """The file's bytes as they are read: its length is known, so the answer is not chunked."""
    first = await anext(chunks, b"")  # a blob that cannot be read fails here, before the answer starts
    exchange.status, exchange.response_started = 200, True
    disposition = content_disposition(str(shown["filename"]))
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", content_type(shown["filename"]).encode()),
                (b"content-length", str(shown["bytes"]).encode()),
                (b"content-disposition", disposition),
                (b"x-request-id", exchange.request_id),
            ],
        }
    )
    await send({"type": "http.response.body", "body": first, "more_body": True})
    async for chunk in chunks:
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})
