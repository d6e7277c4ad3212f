"""``/v1/files`` as the openai SDK calls it, on the store and the mirror: upload, list, retrieve,
content, delete; a place's files only; batch inputs checked at upload; bounds; any process reads them."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import openai
import pytest
from openai import AsyncOpenAI

from llmgw.controlplane.serving.batchbook import StoreBatchBook
from llmgw.controlplane.serving.filebook import FileExpiry, FileSettings, MirrorFileBook
from llmgw.core.tenancy import Owner, Place
from llmgw.gateway import Gateway, GatewaySettings, KeyEntry, hash_secret
from llmgw.mirror.blobs import BlobStore
from llmgw.store import Store
from llmgw.testing.asgi_client import StreamingAsgiTransport
from llmgw.testing.clock import FakeClock

PLACE = "project:acme/ml/chat"
SECRET, TEAMMATE, OTHER = "sk-files-mine", "sk-files-teammate", "sk-files-other"


def _line(custom_id: str, url: str = "/v1/chat/completions") -> str:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


BATCH = ("\n".join(_line(f"r{i}") for i in range(3)) + "\n").encode()


class Plane:
    """A gateway serving /v1/files and /v1/batches from one store and one mirror folder."""

    def __init__(self, store: Store, mirror: Path, settings: FileSettings) -> None:
        self.book = MirrorFileBook(store, BlobStore(mirror), settings=settings)
        self.gateway = Gateway(
            GatewaySettings(), files=self.book, batches=StoreBatchBook(store.batches, self.book)
        )
        keys = self.gateway.keys
        keys.add(KeyEntry("k1", "mine", hash_secret(SECRET), None, Place(Owner.parse(PLACE))))
        keys.add(KeyEntry("k2", "teammate", hash_secret(TEAMMATE), None, Place(Owner.parse(PLACE))))
        other = Place(Owner.parse("project:globex/r/x"))
        keys.add(KeyEntry("k3", "other", hash_secret(OTHER), None, other))

    def sdk(self, secret: str = SECRET) -> AsyncOpenAI:
        url = "http://gateway.test/v1"
        http = httpx.AsyncClient(transport=StreamingAsgiTransport(self.gateway.asgi_app()), base_url=url)
        return AsyncOpenAI(base_url=url, api_key=secret, max_retries=0, http_client=http)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def store(tmp_path: Path, clock: FakeClock) -> AsyncIterator[Store]:
    async with await Store.open(f"sqlite+aiosqlite:///{tmp_path / 'store.db'}", clock=clock) as store:
        yield store


@pytest.fixture
async def plane(store: Store, tmp_path: Path) -> AsyncIterator[Plane]:
    made = Plane(store, tmp_path / "mirror", FileSettings(max_bytes=1 << 20, place_max_bytes=3 << 20))
    yield made
    await made.gateway.close()


async def test_the_sdk_uploads_lists_reads_and_deletes_a_file(plane: Plane, store: Store) -> None:
    async with plane.sdk() as sdk, plane.sdk(TEAMMATE) as teammate:
        made = await sdk.files.create(file=("notes.txt", b"hello files"), purpose="user_data")
        assert made.object == "file" and made.bytes == 11 and made.filename == "notes.txt"
        assert made.purpose == "user_data" and made.expires_at is None and made.status == "processed"
        again = await teammate.files.retrieve(made.id)  # the place's, not the key's
        assert again.id == made.id
        assert (await teammate.files.content(made.id)).content == b"hello files"
        assert [f.id async for f in sdk.files.list()] == [made.id]
        deleted = await sdk.files.delete(made.id)
        assert deleted.deleted and deleted.id == made.id
        with pytest.raises(openai.NotFoundError) as missing:
            await sdk.files.retrieve(made.id)
        assert missing.value.code == "file_not_found"
    assert [b.sha256 for b in await store.blobs.list()] == [], "the blob went with its last file"


async def test_another_place_s_file_answers_not_found(plane: Plane) -> None:
    async with plane.sdk() as mine, plane.sdk(OTHER) as theirs:
        made = await mine.files.create(file=("notes.txt", b"private"), purpose="user_data")
        for call in (theirs.files.retrieve, theirs.files.content, theirs.files.delete):
            with pytest.raises(openai.NotFoundError):
                await call(made.id)
        assert [f async for f in theirs.files.list()] == []
        assert (await mine.files.retrieve(made.id)).id == made.id


async def test_lists_page_in_either_order_and_by_purpose(plane: Plane, clock: FakeClock) -> None:
    async with plane.sdk() as sdk:
        ids = []
        for n in range(4):
            ids.append(
                (await sdk.files.create(file=(f"f{n}.txt", f"file {n}".encode()), purpose="user_data")).id
            )
            await clock.advance(1)
        batch = await sdk.files.create(file=("in.jsonl", BATCH), purpose="batch")
        page = await sdk.files.list(limit=2, purpose="user_data")
        assert [f.id for f in page.data] == [ids[3], ids[2]] and page.has_more
        assert [f.id async for f in sdk.files.list(limit=2, purpose="user_data")] == ids[::-1]
        assert [f.id async for f in sdk.files.list(order="asc", purpose="user_data")] == ids
        assert [f.id async for f in sdk.files.list(purpose="batch")] == [batch.id]
        with pytest.raises(openai.BadRequestError) as bad:
            await sdk.files.list(limit=0)
        assert bad.value.param == "limit"
        with pytest.raises(openai.BadRequestError) as bad:
            await sdk.files.list(order="sideways")  # type: ignore[arg-type]
        assert bad.value.param == "order"


async def test_a_batch_file_is_checked_at_upload_and_expires_by_default(
    plane: Plane, clock: FakeClock
) -> None:
    async with plane.sdk() as sdk:
        with pytest.raises(openai.BadRequestError) as bad:
            await sdk.files.create(file=("in.jsonl", BATCH + b"{not json\n"), purpose="batch")
        assert bad.value.code == "invalid_batch_input" and "line 4" in bad.value.message
        mixed = (_line("a") + "\n" + _line("b", "/v1/embeddings") + "\n").encode()
        with pytest.raises(openai.BadRequestError) as bad:
            await sdk.files.create(file=("in.jsonl", mixed), purpose="batch")
        assert "line 2" in bad.value.message
        made = await sdk.files.create(file=("in.jsonl", BATCH), purpose="batch")
        assert made.expires_at == made.created_at + 30 * 24 * 3600
        kept = await sdk.files.create(
            file=("in.jsonl", BATCH), purpose="batch", expires_after={"anchor": "created_at", "seconds": 3600}
        )
        assert kept.expires_at == kept.created_at + 3600
        with pytest.raises(openai.BadRequestError) as bad:
            await sdk.files.create(
                file=("in.jsonl", BATCH),
                purpose="batch",
                expires_after={"anchor": "created_at", "seconds": 5},
            )
        assert bad.value.param == "expires_after"
        batch = await sdk.batches.create(
            input_file_id=made.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        assert batch.status == "validating"


async def test_expired_files_are_gone_and_swept_with_their_blob(
    plane: Plane, store: Store, clock: FakeClock
) -> None:
    async with plane.sdk() as sdk:
        made = await sdk.files.create(
            file=("in.jsonl", BATCH), purpose="batch", expires_after={"anchor": "created_at", "seconds": 3600}
        )
        await clock.advance(3601)
        with pytest.raises(openai.NotFoundError):
            await sdk.files.retrieve(made.id)
    assert await FileExpiry(store).sweep() == 1
    assert [b.sha256 for b in await store.blobs.list()] == []


async def test_bounds_and_mistakes_answer_4xx_saying_what_to_do(plane: Plane) -> None:
    async with plane.sdk() as sdk:
        with pytest.raises(openai.APIStatusError) as big:
            await sdk.files.create(file=("big.bin", b"x" * ((1 << 20) + 1)), purpose="user_data")
        assert big.value.status_code == 413 and "split it" in big.value.message
        for n in range(3):
            await sdk.files.create(file=(f"f{n}.bin", bytes([n]) * (1 << 20)), purpose="user_data")
        with pytest.raises(openai.APIStatusError) as full:
            await sdk.files.create(file=("more.bin", b"y"), purpose="user_data")
        assert full.value.status_code == 413 and "Delete files" in full.value.message
        with pytest.raises(openai.BadRequestError) as bad:
            await sdk.files.create(file=("x.txt", b"x"), purpose="fine-tune")
        assert bad.value.param == "purpose"
    async with httpx.AsyncClient(
        transport=StreamingAsgiTransport(plane.gateway.asgi_app()), base_url="http://gateway.test"
    ) as http:
        auth = {"authorization": f"Bearer {SECRET}"}
        raw = await http.post(
            "/v1/files", content=b"{}", headers={**auth, "content-type": "application/json"}
        )
        assert raw.status_code == 400 and "multipart/form-data" in raw.json()["error"]["message"]
        no_file = await http.post(
            "/v1/files", data={"purpose": "user_data"}, files={"other": b""}, headers=auth
        )
        assert no_file.status_code == 400 and no_file.json()["error"]["param"] == "file"
        wrong = await http.put("/v1/files", headers=auth)
        assert wrong.status_code == 405
        unknown = await http.get("/v1/files/file-x/elsewhere", headers=auth)
        assert unknown.status_code == 404


async def test_a_second_process_on_the_same_store_and_mirror_reads_the_file(
    store: Store, tmp_path: Path
) -> None:
    settings = FileSettings()
    first, second = Plane(store, tmp_path / "mirror", settings), Plane(store, tmp_path / "mirror", settings)
    try:
        async with first.sdk() as one, second.sdk(TEAMMATE) as other:
            made = await one.files.create(file=("notes.txt", b"shared"), purpose="user_data")
            assert (await other.files.content(made.id)).content == b"shared"
            assert (await other.files.delete(made.id)).deleted
            with pytest.raises(openai.NotFoundError):
                await one.files.retrieve(made.id)
    finally:
        await first.gateway.close()
        await second.gateway.close()


async def test_a_gateway_without_a_book_says_where_files_are_kept() -> None:
    gateway = Gateway(GatewaySettings())
    gateway.keys.add(KeyEntry("k1", "mine", hash_secret(SECRET), None, Place(Owner.parse(PLACE))))
    url = "http://gateway.test/v1"
    http = httpx.AsyncClient(transport=StreamingAsgiTransport(gateway.asgi_app()), base_url=url)
    async with AsyncOpenAI(base_url=url, api_key=SECRET, max_retries=0, http_client=http) as sdk:
        with pytest.raises(openai.NotFoundError) as missing:
            await sdk.files.create(file=("x.txt", b"x"), purpose="user_data")
        assert "control plane" in missing.value.message
    await gateway.close()


def _multipart(filename: str) -> bytes:
    """A form with ``filename`` sent as it is (the SDK's httpx percent-encodes control characters)."""
    return (
        b"--b\r\n"
        b'Content-Disposition: form-data; name="purpose"\r\n\r\nuser_data\r\n'
        b"--b\r\n"
        b'Content-Disposition: form-data; name="file"; filename="' + filename.encode() + b'"\r\n'
        b"Content-Type: text/plain\r\n\r\nhello\r\n"
        b"--b--\r\n"
    )


@pytest.mark.parametrize(
    ("filename", "said"),
    [
        ("../../etc/passwd", "'/'"),
        ("dir\\notes.txt", "'\\\\'"),
        ("..", "'..'"),
        ("notes\x00.txt", "\\x00"),
        ("notes\x1b[2J.txt", "\\x1b"),
        ("notes\x7f.txt", "\\x7f"),
        ("n" * 256, "at most 255"),
    ],
)
async def test_an_unsafe_file_name_is_refused_saying_which_character(
    plane: Plane, store: Store, filename: str, said: str
) -> None:
    async with httpx.AsyncClient(
        transport=StreamingAsgiTransport(plane.gateway.asgi_app()), base_url="http://gateway.test"
    ) as http:
        headers = {"authorization": f"Bearer {SECRET}", "content-type": "multipart/form-data; boundary=b"}
        answer = await http.post("/v1/files", content=_multipart(filename), headers=headers)
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["param"] == "file"
    assert said in error["message"]
    assert await store.files.bytes_of(PLACE) == 0
    assert await store.blobs.list() == []


async def test_a_name_kept_from_before_the_checks_never_breaks_the_contents_header(
    plane: Plane, store: Store
) -> None:
    async with plane.sdk() as sdk:
        await sdk.files.create(file=("notes.txt", b"hello"), purpose="user_data")
    (blob,) = await store.blobs.list()
    kept = await store.files.add(
        owner=PLACE,
        key_id="k1",
        purpose="user_data",
        filename='a"b\r\nX-Evil: 1\\é.txt',
        size=5,
        sha256=blob.sha256,
        expires_s=None,
    )
    async with httpx.AsyncClient(
        transport=StreamingAsgiTransport(plane.gateway.asgi_app()), base_url="http://gateway.test"
    ) as http:
        answer = await http.get(f"/v1/files/{kept.id}/content", headers={"authorization": f"Bearer {SECRET}"})
    assert answer.status_code == 200 and answer.content == b"hello"
    assert "x-evil" not in answer.headers
    assert answer.headers["content-disposition"] == (
        "inline; filename=\"a_b__X-Evil: 1__.txt\"; filename*=UTF-8''a%22b%0D%0AX-Evil%3A%201%5C%C3%A9.txt"
    )
