"""Knowledge search: quality on a judged set, ingestion speed, and query latency at 100k passages.

    make bench-knowledge            (or: python bench/knowledge/run.py [--passages 100000])

The judged set is built here from public-domain text: the 27 Amendments to
the US Constitution (``amendments.md``), one passage each, and 40 questions
(``queries.json``), each judged relevant to the one Amendment that answers
it; about half use the Amendment's own words, half paraphrase it. The
embedding model is the real all-MiniLM-L6-v2 (converted to GGUF,
``llmgw.testing.embedding_model``) on llama-server, called directly on its
``/v1/embeddings`` (what the gateway proxies to). The store is SQLite; the
keywords are ranked by BM25 in memory (what a control plane does) and, for
comparison, by the store's FTS5; the vectors are searched in memory.

Latency is measured on a collection of ``--passages`` synthetic passages
(random unit vectors and random words: they stand in for volume only, they are
not judged), with the judged questions as queries, each query embedded by the
model as part of its time. ``--postgres`` also stores them in a throwaway
PostgreSQL and times building the in-memory index from it. Prints one JSON
line at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from llmgw.core.tenancy import CLUSTER
from llmgw.engines import builds
from llmgw.knowledge.embedding import GatewayEmbedder, to_bytes
from llmgw.knowledge.searching import KnowledgeIndex, Mode
from llmgw.knowledge.service import Knowledge, knowledge_with
from llmgw.store import Store
from llmgw.store.knowledge import DocumentRecord, NewPassage
from llmgw.testing.cluster import free_port
from llmgw.testing.embedding_model import DIMENSIONS, cache_dir, embedding_model

HERE = Path(__file__).parent
MODEL = "minilm"


def start_llama_server(model: Path, port: int, threads: int) -> subprocess.Popen[bytes]:
    installed = builds.installed(cache_dir())
    if not installed:
        sys.exit("no llama.cpp build: run 'make engine'")
    binary = installed[0].binary
    command = [
        str(binary), "-m", str(model), "--embeddings", "--pooling", "mean", "--host", "127.0.0.1",
        "--port", str(port), "-t", str(threads), "-c", "4096", "-b", "4096", "-ub", "4096", "--parallel", "1",
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as answer:
                if answer.status == 200:
                    return process
        except OSError:
            time.sleep(0.2)
    process.kill()
    sys.exit("llama-server did not become healthy within 60 s")


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


async def judged(
    knowledge: Knowledge, fts5: KnowledgeIndex, queries: list[tuple[str, str]]
) -> tuple[dict[str, dict[str, float]], float, int]:
    record = await knowledge.store.knowledge.create("amendments", CLUSTER, MODEL, "bench")
    prepared = knowledge.ingesting.prepare("amendments.md", (HERE / "amendments.md").read_bytes())
    started = time.perf_counter()
    await knowledge.ingesting.store(record, prepared, "bench")
    ingest_s = time.perf_counter() - started
    record = await knowledge.store.knowledge.get("amendments")
    quality = {}
    kinds = [(mode.value, knowledge.index, mode) for mode in Mode]
    kinds += [(f"{mode.value}_fts5", fts5, mode) for mode in (Mode.KEYWORD, Mode.HYBRID)]
    for name, index, mode in kinds:
        recall, reciprocal = [], []
        for query, wanted in queries:
            found = await index.search_in([record], query, 10, mode)
            labels = [p.text.split("\n", 1)[0].removeprefix("## Amendment ").strip() for p in found]
            rank = next((i for i, label in enumerate(labels) if label == wanted), None)
            recall.append(1.0 if rank is not None and rank < 5 else 0.0)
            reciprocal.append(1.0 / (rank + 1) if rank is not None else 0.0)
        quality[name] = {
            "recall@5": round(statistics.mean(recall), 3),
            "mrr@10": round(statistics.mean(reciprocal), 3),
        }
    return quality, len(prepared.pieces) / ingest_s, len(prepared.pieces)


async def ingestion(knowledge, passages: int, seed: int = 11) -> float:  # type: ignore[no-untyped-def]
    """Passages per second through the whole upload path (read, split, embed by the model, store),
    on a document of about ``passages`` passages of the Amendments' sentences shuffled."""
    sentences = [
        s.strip() + "." for s in (HERE / "amendments.md").read_text().split(".") if len(s.split()) > 4
    ]
    pick = random.Random(seed)
    paragraphs = [" ".join(pick.choices(sentences, k=4)) for _ in range(passages)]
    text = "\n\n".join(f"## Part {i}\n\n{p}" for i, p in enumerate(paragraphs)).encode()
    record = await knowledge.store.knowledge.create("ingested", CLUSTER, MODEL, "bench")
    started = time.perf_counter()
    prepared = knowledge.ingesting.prepare("shuffled.md", text)
    await knowledge.ingesting.store(record, prepared, "bench")
    return len(prepared.pieces) / (time.perf_counter() - started)


async def fill(store: Store, passages: int, seed: int = 7) -> int:
    """A collection of ``passages`` synthetic passages: random unit vectors, random words."""
    record = await store.knowledge.create("big", CLUSTER, MODEL, "bench")
    rng = np.random.default_rng(seed)
    words = (HERE / "amendments.md").read_text().split() + [f"w{i}" for i in range(5000)]
    pick = random.Random(seed)
    per_document = 5000
    for number in range(0, passages, per_document):
        count = min(per_document, passages - number)
        vectors = rng.standard_normal((count, DIMENSIONS)).astype(np.float32)
        rows = [
            NewPassage(i, " ".join(pick.choices(words, k=60)), 0, 0, to_bytes(vectors[i]))
            for i in range(count)
        ]
        document = DocumentRecord(
            f"synthetic-{number}.txt", "text", 0, "0" * 64, count, "bench", datetime.now(UTC)
        )
        await store.knowledge.add_document("big", document, rows)
    return record.id


async def latency(
    knowledge: Knowledge, fts5: KnowledgeIndex, queries: list[str], rounds: int
) -> dict[str, dict[str, float]]:
    record = await knowledge.store.knowledge.get("big")
    started = time.perf_counter()
    index = await knowledge.index.index(record)
    build_s = time.perf_counter() - started
    await fts5.index(record)
    out: dict[str, dict[str, float]] = {"index_build_s": {"value": round(build_s, 2)}}
    timings: dict[str, list[float]] = {"embed_only": [], "vector_search_only": [], "bm25_only": []}
    for query in queries[:5]:  # warm
        await knowledge.embedder.embed(MODEL, [query])
    for _ in range(rounds):
        for query in queries:
            started = time.perf_counter()
            vector = (await knowledge.embedder.embed(MODEL, [query]))[0]
            timings["embed_only"].append(time.perf_counter() - started)
            started = time.perf_counter()
            index.nearest(vector, 50)
            timings["vector_search_only"].append(time.perf_counter() - started)
            started = time.perf_counter()
            assert index.keywords is not None
            index.keywords.search(query, 50)
            timings["bm25_only"].append(time.perf_counter() - started)
            for mode in Mode:
                started = time.perf_counter()
                await knowledge.index.search_in([record], query, 5, mode)
                timings.setdefault(mode.value, []).append(time.perf_counter() - started)
            for mode in (Mode.KEYWORD, Mode.HYBRID):
                started = time.perf_counter()
                await fts5.search_in([record], query, 5, mode)
                timings.setdefault(f"{mode.value}_fts5", []).append(time.perf_counter() - started)
    for name, values in timings.items():
        out[name] = {
            "p50_ms": round(1000 * percentile(values, 0.5), 2),
            "p90_ms": round(1000 * percentile(values, 0.9), 2),
            "p99_ms": round(1000 * percentile(values, 0.99), 2),
            "n": len(values),
        }
    return out


async def postgres_build(passages: int) -> dict[str, float]:
    """Seconds to store ``passages`` synthetic passages in a throwaway PostgreSQL, and to build the
    in-memory index from it (what each control plane does once per collection and revision)."""
    from llmgw.testing import postgres

    with postgres.postgres() as server:
        store = await Store.open(server.url, timeout_s=600)
        try:
            started = time.perf_counter()
            await fill(store, passages)
            stored_s = time.perf_counter() - started
            record = await store.knowledge.get("big")
            started = time.perf_counter()
            await KnowledgeIndex(store.knowledge, GatewayEmbedder(lambda: "", "")).index(record)
            return {"store_s": round(stored_s, 1), "index_build_s": round(time.perf_counter() - started, 2)}
        finally:
            await store.close()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--passages", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--ingest-passages", type=int, default=400)
    # one thread: a query's embedding is a few tokens, and llama.cpp's threads wait on each other at
    # every layer, so on shared cores two threads put a stolen core's delay into the tail
    parser.add_argument("--threads", type=int, default=1, help="llama-server's threads (default 1)")
    parser.add_argument("--postgres", action="store_true", help="also time the index build on PostgreSQL")
    args = parser.parse_args()
    load_at_start = [round(x, 2) for x in os.getloadavg()]
    queries = [(q, a) for q, a in json.loads((HERE / "queries.json").read_text())]
    model = embedding_model()
    port = free_port()
    server = start_llama_server(model, port, args.threads)
    embedder = GatewayEmbedder(lambda: f"http://127.0.0.1:{port}", "unused")
    try:
        with tempfile.TemporaryDirectory() as folder:
            store = await Store.open(f"sqlite+aiosqlite:///{folder}/bench.db", timeout_s=600)
            knowledge = knowledge_with(store, embedder)
            fts5 = KnowledgeIndex(store.knowledge, embedder, keywords_in_store=True)
            quality, _, pieces = await judged(knowledge, fts5, queries)
            print(f"judged set: {pieces} passages, {len(queries)} queries: {quality}", file=sys.stderr)
            per_s = await ingestion(knowledge, args.ingest_passages)
            print(f"ingestion: {per_s:.1f} passages/s", file=sys.stderr)
            started = time.perf_counter()
            await fill(store, args.passages)
            print(
                f"stored {args.passages} synthetic passages in {time.perf_counter() - started:.1f} s",
                file=sys.stderr,
            )
            timings = await latency(knowledge, fts5, [q for q, _ in queries], args.rounds)
            await store.close()
        if args.postgres:
            timings["postgresql_100k"] = await postgres_build(args.passages)
    finally:
        await embedder.close()
        server.terminate()
        server.wait(10)
    best_alone = max(quality["vector"]["mrr@10"], quality["keyword"]["mrr@10"])
    print(f"load average at the start {load_at_start}, now {os.getloadavg()}", file=sys.stderr)
    result = {
        "bench": "knowledge",
        "judged_set": "27 Amendments to the US Constitution (public domain), 40 judged questions",
        "embedding_model": "all-MiniLM-L6-v2 (GGUF f16) on llama-server",
        "quality": quality,
        "hybrid_at_least_best_alone_mrr": quality["hybrid"]["mrr@10"] >= best_alone,
        "ingestion_passages_per_s": round(per_s, 1),
        "passages": args.passages,
        "latency": timings,
        "load_average_1m": round(os.getloadavg()[0], 2),
        "load_average_at_start": load_at_start,
        "cores": os.cpu_count(),
        "llama_server_threads": args.threads,
        "goal_p99_ms": 50,
        "hybrid_p99_within_goal": timings["hybrid"]["p99_ms"] <= 50,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    asyncio.run(main())
