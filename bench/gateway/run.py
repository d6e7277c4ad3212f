"""The gateway benchmark: direct to an engine, through llmgw, sglang-router and LiteLLM's proxy, in one run.

The engine is llmgw's llama-server stand-in (it answers at once), registered
the way llmgw registers any engine: a real control plane and agent
(``llmgw.testing.cluster``), the agent told by ``engines.llamacpp.binary`` to
run the stand-in instead of an installed llama-server. LiteLLM's proxy (one
worker, in its own virtualenv) is pointed at the same engine, and so is
sglang-router (PyPI's Rust router, in its own virtualenv: ``peers.py``), the
fastest peer: the JSON line's ``ratio_rust_c1_rps`` and ``ratio_rust_c64_rps``
are llmgw's requests/s over the Rust router's. Each target's ``c64_cores`` is
the CPU it and its children spent during the c=64 phase over its length.

Each target gets the same load, from ``loadgen.py`` in its own process:
latency at concurrency 1, requests/s at concurrency 64, a stream of 64 events
at concurrency 1 (time to first event, gap between events). The gateway's RSS
is read before and after 100k requests. Figures are printed as a table and
then as one JSON line (the last line of the output).

With ``--limits`` llmgw is measured twice: with limits off, then with
10,000 keys in 100 projects (10 teams, 1 organization) every one limited
(key, project, team and organization; limits too high ever to refuse), the
load sent with one of those keys; the JSON line gains ``llmgw_limits`` and
the ratios to the run with limits off.

With ``--workers N`` (default 2; 0 skips it) the control plane is then
started again with one gateway process and with ``N`` workers
(``bench/gateway/workerphase.py``), each measured at concurrency 64 with the
CPU it spent per request; the JSON line gains ``workers``. The other phases
run with ``gateway.workers: 1``. ``--workers-only`` runs only this phase.

    python bench/gateway/run.py [--litellm-venv DIR] [--rust-router-venv DIR] [--quick]
                                [--profile FILE] [--limits] [--workers N]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from cheapload import nginx_binary, write_nginx_launcher, wrk_load
from layers import figures as layer_figures
from layers import layers, read, table
from peers import cpu_seconds, start_rust_router
from workerphase import measure_workers

from llmgw.controlplane.config import save_server_config
from llmgw.core.limits import Limits
from llmgw.core.tenancy import Owner, OwnerKind
from llmgw.store.database import Store
from llmgw.store.secretbox import SecretBox, read_key
from llmgw.testing.cluster import Cluster, engine_pid, free_port, wait_for
from llmgw.testing.llama_server_standin import write_launcher

HERE = Path(__file__).resolve().parent
MODEL = "bench-chat"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 16}
LITELLM_KEY = "sk-bench-" + "0123456789abcdef" * 2
DEFAULT_LITELLM_VENV = (
    Path(os.environ.get("LLMGW_CACHE", "~/.cache/llmgw")).expanduser() / "bench/litellm-venv"
)
DEFAULT_RUST_ROUTER_VENV = (
    Path(os.environ.get("LLMGW_CACHE", "~/.cache/llmgw")).expanduser() / "bench/sglang-router-venv"
)


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def load(port: int, key: str, body: Path, *, concurrency: int, count: int, duration: float,
         stream: bool = False) -> dict[str, Any]:  # fmt: skip
    command = [
        sys.executable, str(HERE / "loadgen.py"), "--port", str(port), "--key", key, "--body", str(body),
        "--concurrency", str(concurrency), "--count", str(count), "--duration", str(duration),
    ]  # fmt: skip
    if stream:
        command.append("--stream")
    out = subprocess.run(command, capture_output=True, text=True, timeout=duration + 120, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"load generator failed: {out.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(out.stdout)
    if result["errors"]:
        print(f"  ! {result['errors']} errors, e.g. {result.get('error_sample')}", flush=True)
    return result


class Target:
    def __init__(self, name: str, port: int, key: str, pid: int = 0) -> None:
        self.name = name
        self.port = port
        self.key = key
        self.pid = pid
        """The target's process (0: not known); its CPU, and its children's, is read over the c=64 phase."""
        self.figures: dict[str, Any] = {}


def profiling(pid: int, output: Path | None, seconds: float) -> subprocess.Popen[bytes] | None:
    """py-spy recording ``pid`` for ``seconds`` into ``output`` (collapsed stacks), if asked and installed."""
    if output is None:
        return None
    spy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if spy is None:
        print("  ! --profile needs py-spy: pip install py-spy", flush=True)
        return None
    command = [spy, "record", "--pid", str(pid), "--duration", str(max(1, round(seconds))), "--rate", "250",
               "--nonblocking", "--format", "raw", "--output", str(output)]  # fmt: skip
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def measure(target: Target, bodies: dict[str, Path], scale: float, profile: Path | None = None,
            pid: int = 0) -> None:  # fmt: skip
    """Latency at c=1, throughput at c=64, and a stream at c=1, for one target."""
    slow = target.name == "litellm"
    n = int((400 if slow else 5000) * scale)
    print(f"[{target.name}] warming up, then {n} requests at concurrency 1", flush=True)
    load(target.port, target.key, bodies["whole"], concurrency=1, count=max(20, n // 10), duration=10)
    c1 = load(target.port, target.key, bodies["whole"], concurrency=1, count=n, duration=20 * scale)
    print(f"[{target.name}] concurrency 64", flush=True)
    spy = profiling(pid, profile, 9 * scale)
    cpu_before, wall_before = (cpu_seconds(target.pid) if target.pid else 0.0), time.monotonic()
    c64 = load(target.port, target.key, bodies["whole"], concurrency=64, count=10**6, duration=10 * scale)
    cores = (cpu_seconds(target.pid) - cpu_before) / (time.monotonic() - wall_before) if target.pid else None
    if spy is not None:
        spy.wait(60)
        print(
            f"[{target.name}] profile at concurrency 64: {profile} (collapsed stacks, for speedscope.app)",
            flush=True,
        )
    streams = int((100 if slow else 1000) * scale)
    print(f"[{target.name}] {streams} streams at concurrency 1", flush=True)
    st = load(target.port, target.key, bodies["stream"], concurrency=1, count=streams, duration=20 * scale,
              stream=True)  # fmt: skip
    figures = {
        "c1_rps": c1["rps"],
        "c1_p50_us": c1["latency_us"]["p50"],
        "c1_p99_us": c1["latency_us"]["p99"],
        "c64_rps": c64["rps"],
        "c64_p50_us": c64["latency_us"]["p50"],
        "ttft_p50_us": st["ttft_us"]["p50"],
        "ttft_p99_us": st["ttft_us"]["p99"],
        "gap_mean_us": st["gap_us"]["mean"],
        "stream_events": st["events"],
        "errors": c1["errors"] + c64["errors"] + st["errors"],
    }
    if cores is not None:
        figures["c64_cores"] = round(cores, 2)
    target.figures = {k: round(v, 1) if isinstance(v, float) else v for k, v in figures.items()}
    if spy is not None and profile is not None and profile.exists():
        with profile.open(encoding="utf-8") as lines:
            rows = layers(read(lines), c64["rps"], cores)
        print(
            f"[{target.name}] CPU per request at concurrency 64, by layer (layers.py):\n{table(rows)}",
            flush=True,
        )
        target.figures["profile_layers"] = layer_figures(rows)


def start_cluster(home: Path, static: bool = False) -> tuple[Cluster, int, str]:
    """A control plane and an agent whose llama-server is the stand-in (``static``: a static nginx,
    ``cheapload.py``); (cluster, engine port, engine key)."""
    cluster = Cluster(home / "cluster", home / "cache")
    try:
        cluster.config.gateway.workers = 1  # one process, as the figures before workers (see --workers)
        save_server_config(cluster.config, cluster.home / "server.yaml")
        cluster.start_server()
        weights = home / "standin.gguf"
        weights.write_bytes(b"GGUF stand-in weights\n")
        cluster.add_model(MODEL, weights, {"ctx_size": 2048, "parallel": 64})
        cluster.create_key("bench")
        nginx = nginx_binary()
        if static and nginx is not None:
            launcher = write_nginx_launcher(home / "bin" / "llama-server", sys.executable, nginx)
        else:
            launcher = write_launcher(home / "bin" / "llama-server")
        cluster.add_node("node1", engines={"llamacpp": {"binary": str(launcher)}})
        cluster.start_agent("node1")
        replica = cluster.wait_ready(MODEL, 60)

        async def engine_key() -> str:
            # the engine keys are sealed in the store: opened with the control plane's key, as it does
            sealing = SecretBox(read_key(cluster.config.path(cluster.config.store.secrets_key)))
            store = await Store.open(cluster.config.store_url, secrets=sealing)
            try:
                return (await store.replicas.get(replica["id"])).api_key
            finally:
                await store.close()

        return cluster, int(replica["port"]), asyncio.run(engine_key())
    except BaseException:  # a start that failed leaves no process behind
        cluster.stop()
        raise


HIGH = Limits(
    requests_per_minute=10**9,
    tokens_per_minute=10**12,
    concurrent=10**6,
    tokens_per_day=10**15,
    tokens_per_month=10**15,
)
"""Limits on every key and owner that never refuse: every check runs, none says no."""


def limit_everything(cluster: Cluster, keys: int = 10_000, projects: int = 100) -> str:
    """``keys`` keys in ``projects`` projects, every key and owner limited; the secret of one of them."""

    async def fill() -> str:
        store = await Store.open(cluster.config.store_url)
        try:
            await store.tenants.create(OwnerKind.ORG, "bench")
            await store.limits.set("org:bench", HIGH)
            for t in range(10):
                await store.tenants.create(OwnerKind.TEAM, f"bench/t{t}")
                await store.limits.set(f"team:bench/t{t}", HIGH)
            for p in range(projects):
                path = f"bench/t{p % 10}/p{p}"
                await store.tenants.create(OwnerKind.PROJECT, path)
                await store.limits.set(f"project:{path}", HIGH)
            secret = ""
            for k in range(keys):
                place = Owner(OwnerKind.PROJECT, f"bench/t{k % projects % 10}/p{k % projects}")
                record, secret = await store.keys.create(f"bench-{k}", "bench", place)
                await store.limits.set(f"key:{record.id}", HIGH)
            return secret
        finally:
            await store.close()

    secret = asyncio.run(fill())
    # one change through /api makes the control plane reload keys and limits
    cluster.admin.request("PUT", "/api/limits/org:bench", HIGH.as_dict())
    return secret


def start_litellm(
    venv: Path, home: Path, engine_port: int, engine_key: str
) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    config = home / "litellm.yaml"
    config.write_text(
        json.dumps(
            {
                "model_list": [
                    {
                        "model_name": MODEL,
                        "litellm_params": {
                            "model": f"openai/{MODEL}",
                            "api_base": f"http://127.0.0.1:{engine_port}/v1",
                            "api_key": engine_key,
                        },
                    }
                ],
                "litellm_settings": {"telemetry": False},
                "general_settings": {"master_key": LITELLM_KEY},
            }
        )
    )
    env = {
        **os.environ,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_TELEMETRY": "False",
        "LITELLM_LOG": "ERROR",
        "NO_DOCKER": "True",
    }
    log = (home / "litellm.log").open("wb")
    process = subprocess.Popen(
        [str(venv / "bin" / "litellm"), "--config", str(config), "--host", "127.0.0.1", "--port", str(port),
         "--num_workers", "1"],
        stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
    )  # fmt: skip

    def alive() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"LiteLLM exited: {(home / 'litellm.log').read_text()[-2000:]}")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health/liveliness", timeout=2) as answer:
            return bool(answer.status == 200)

    wait_for(alive, 120, "LiteLLM's proxy answers", interval_s=0.5)
    return process, port


def engine_process(port: int) -> int:
    """The engine's pid for its CPU figure (0 when it cannot be found: the figure is then left out)."""
    try:
        return engine_pid(port)
    except Exception:  # a figure less, not a failed run
        return 0


def added(through: dict[str, Any], direct: dict[str, Any], field: str) -> float:
    return round(through[field] - direct[field], 1)


def main() -> None:
    parser = argparse.ArgumentParser(description="Benchmark llmgw's gateway against the engine and LiteLLM.")
    parser.add_argument("--litellm-venv", type=Path, default=DEFAULT_LITELLM_VENV,
                        help="virtualenv with litellm[proxy] (skipped when it has none)")  # fmt: skip
    parser.add_argument("--rust-router-venv", type=Path, default=DEFAULT_RUST_ROUTER_VENV,
                        help="virtualenv with sglang-router (skipped when it has none)")  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="a tenth of the requests, for a smoke run")
    parser.add_argument("--rss-requests", type=int, default=100_000)
    parser.add_argument("--limits", action="store_true",
                        help="also measure llmgw with 10,000 keys, every one limited")  # fmt: skip
    parser.add_argument(
        "--profile", type=Path, help="record llmgw at concurrency 64 with py-spy into this file"
    )
    parser.add_argument("--workers", type=int, default=2,
                        help="also measure c=64 with N gateway workers against one (0: skip)")  # fmt: skip
    parser.add_argument("--workers-only", action="store_true", help="measure only the workers phase")
    parser.add_argument(
        "--rounds", type=int, default=3, help="workers phase: alternate 1 and N workers so often"
    )
    parser.add_argument(
        "--python-load", action="store_true", help="workers phase: loadgen.py, stand-in (not wrk, nginx)"
    )
    args = parser.parse_args()
    scale = 0.1 if args.quick else 1.0
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="llmgw-bench-") as tmp:
        home = Path(tmp)
        bodies = {"whole": home / "whole.json", "stream": home / "stream.json"}
        bodies["whole"].write_text(json.dumps(CHAT))
        bodies["stream"].write_text(json.dumps({**CHAT, "stream": True}))
        cheap = not args.python_load and shutil.which("wrk") is not None
        cluster, engine_port, engine_key = start_cluster(home, static=args.workers_only and cheap)
        litellm: subprocess.Popen[bytes] | None = None
        rust: subprocess.Popen[bytes] | None = None

        def workers_load(port: int, key: str, body: Path, **how: Any) -> dict[str, Any]:
            if not cheap:
                return load(port, key, body, **how)
            return wrk_load("wrk", port, key, body, concurrency=how["concurrency"], duration=how["duration"],
                            script_dir=home)  # fmt: skip

        def workers_phase() -> dict[str, Any]:
            engine = "static nginx" if args.workers_only and cheap and nginx_binary() else "stand-in"
            print(f"workers phase: load from {'wrk' if cheap else 'loadgen.py'}, engine {engine}", flush=True)
            return measure_workers(cluster, args.workers, MODEL, bodies["whole"], scale, workers_load,
                                   engine_port=engine_port, rounds=args.rounds)  # fmt: skip

        if args.workers_only:
            try:
                figures = workers_phase()
            finally:
                cluster.stop()
            print(json.dumps({"workers": figures}, separators=(",", ":")))
            return
        try:
            gateway_pid = cluster.processes["server"].pid
            targets = [
                Target("direct", engine_port, engine_key, engine_process(engine_port)),
                Target("llmgw", cluster.http_port, cluster.key, gateway_pid),
            ]
            if (args.rust_router_venv / "bin" / "sglang-router").exists():
                rust, rust_port = start_rust_router(args.rust_router_venv, home, engine_port, engine_key,
                                                    wait_for)  # fmt: skip
                targets.append(Target("rust", rust_port, engine_key, rust.pid))
            else:
                print(f"sglang-router skipped: no {args.rust_router_venv}/bin/sglang-router "
                      "(make bench-gateway installs it)")  # fmt: skip
            if (args.litellm_venv / "bin" / "litellm").exists():
                litellm, litellm_port = start_litellm(args.litellm_venv, home, engine_port, engine_key)
                targets.append(Target("litellm", litellm_port, LITELLM_KEY, litellm.pid))
            else:
                print(f"LiteLLM skipped: no {args.litellm_venv}/bin/litellm (make bench-gateway installs it)")
            for target in targets:
                if target.name == "llmgw":
                    measure(target, bodies, scale, args.profile, gateway_pid)
                else:
                    measure(target, bodies, scale)
            if args.limits:
                print("[llmgw] limiting 10,000 keys in 100 projects", flush=True)
                limited = Target("llmgw_limits", cluster.http_port, limit_everything(cluster))
                measure(limited, bodies, scale)
                targets.append(limited)
            rss_count = int(args.rss_requests * scale)
            rss_before = rss_kib(gateway_pid)
            print(f"[llmgw] {rss_count} requests at concurrency 64 for the RSS", flush=True)
            long = load(cluster.http_port, cluster.key, bodies["whole"], concurrency=64, count=rss_count,  # type: ignore[attr-defined]
                        duration=300)  # fmt: skip
            rss_after = rss_kib(gateway_pid)
            workers = None
            if args.workers:
                workers = workers_phase()
        finally:
            for peer in (litellm, rust):
                if peer is not None:
                    peer.terminate()
                    peer.wait(20)
            cluster.stop()
    by = {t.name: t.figures for t in targets}
    direct, gw = by["direct"], by["llmgw"]
    report: dict[str, Any] = {
        "direct": direct,
        "llmgw": {
            **gw,
            "added_p50_us": added(gw, direct, "c1_p50_us"),
            "added_p99_us": added(gw, direct, "c1_p99_us"),
            "added_ttft_p50_us": added(gw, direct, "ttft_p50_us"),
            "added_gap_us": added(gw, direct, "gap_mean_us"),
            "rss_kib_before": rss_before,
            "rss_kib_after": rss_after,
            "rss_growth_pct": round(100 * (rss_after - rss_before) / rss_before, 1),
            "rss_requests": long["count"],
            "rss_run_rps": long["rps"],
        },
        "ratio_llmgw_direct_c64_rps": round(gw["c64_rps"] / direct["c64_rps"], 3),
    }
    if "litellm" in by:
        lite = by["litellm"]
        report["litellm"] = {
            **lite,
            "added_p50_us": added(lite, direct, "c1_p50_us"),
            "added_p99_us": added(lite, direct, "c1_p99_us"),
            "added_ttft_p50_us": added(lite, direct, "ttft_p50_us"),
            "added_gap_us": added(lite, direct, "gap_mean_us"),
        }
        report["ratio_llmgw_litellm_c64_rps"] = round(gw["c64_rps"] / lite["c64_rps"], 2)
        report["ratio_llmgw_litellm_added_p50"] = round(
            report["llmgw"]["added_p50_us"] / max(1.0, report["litellm"]["added_p50_us"]), 4
        )
    if "rust" in by:
        rust_figures = by["rust"]
        report["rust"] = {
            **rust_figures,
            "added_p50_us": added(rust_figures, direct, "c1_p50_us"),
            "added_p99_us": added(rust_figures, direct, "c1_p99_us"),
            "added_ttft_p50_us": added(rust_figures, direct, "ttft_p50_us"),
            "added_gap_us": added(rust_figures, direct, "gap_mean_us"),
        }
        report["ratio_rust_c1_rps"] = round(gw["c1_rps"] / rust_figures["c1_rps"], 3)
        report["ratio_rust_c64_rps"] = round(gw["c64_rps"] / rust_figures["c64_rps"], 3)
        report["ratio_rust_added_p50"] = round(
            report["llmgw"]["added_p50_us"] / max(1.0, report["rust"]["added_p50_us"]), 3
        )
    if "llmgw_limits" in by:
        lim = by["llmgw_limits"]
        report["llmgw_limits"] = {
            **lim,
            "added_p50_us": added(lim, direct, "c1_p50_us"),
            "added_p50_us_over_limits_off": added(lim, gw, "c1_p50_us"),
        }
        report["ratio_limits_on_off_c64_rps"] = round(lim["c64_rps"] / gw["c64_rps"], 3)
        report["ratio_limits_on_off_c1_p50"] = round(lim["c1_p50_us"] / gw["c1_p50_us"], 3)
    if workers is not None:
        report["workers"] = workers
    report["seconds"] = round(time.monotonic() - started, 1)
    print_table(report)
    print(json.dumps(report, separators=(",", ":")))


def print_table(report: dict[str, Any]) -> None:
    names = [n for n in ("direct", "llmgw", "llmgw_limits", "rust", "litellm") if n in report]
    rows = [
        ("req/s at c=1", "c1_rps"),
        ("p50 at c=1 (µs)", "c1_p50_us"),
        ("p99 at c=1 (µs)", "c1_p99_us"),
        ("added p50 at c=1 (µs)", "added_p50_us"),
        ("added p99 at c=1 (µs)", "added_p99_us"),
        ("req/s at c=64", "c64_rps"),
        ("cores busy at c=64", "c64_cores"),
        ("stream: first event p50 (µs)", "ttft_p50_us"),
        ("stream: added first event (µs)", "added_ttft_p50_us"),
        ("stream: mean gap (µs)", "gap_mean_us"),
        ("stream: added gap (µs)", "added_gap_us"),
        ("errors", "errors"),
    ]
    print()
    print(f"{'':34}" + "".join(f"{n:>14}" for n in names))
    for label, field in rows:
        cells = "".join(f"{report[n].get(field, ''):>14}" for n in names)
        print(f"{label:34}{cells}")
    gw = report["llmgw"]
    print(f"\nllmgw RSS: {gw['rss_kib_before']} KiB -> {gw['rss_kib_after']} KiB after {gw['rss_requests']} "
          f"requests ({gw['rss_growth_pct']:+.1f} %, {gw['rss_run_rps']} req/s)")  # fmt: skip
    print(f"llmgw/direct req/s at c=64: {report['ratio_llmgw_direct_c64_rps']}")
    if "ratio_limits_on_off_c64_rps" in report:
        print(f"limits on/off: req/s at c=64 {report['ratio_limits_on_off_c64_rps']}, added p50 "
              f"{report['llmgw_limits']['added_p50_us_over_limits_off']} µs")  # fmt: skip
    if "workers" in report:
        w = report["workers"]
        for name in (n for n in w if n.startswith("workers_")):
            f = w[name]
            print(f"{name}: {f['c64_rps']} req/s at c=64, {f['cpu_us_per_request']} µs CPU/request, "
                  f"{f['cores_busy']} cores busy")  # fmt: skip
        print(f"workers/one process req/s at c=64: {w['ratio_workers_c64_rps']}")
    if "ratio_rust_c64_rps" in report:
        print(f"llmgw/sglang-router req/s at c=1: {report['ratio_rust_c1_rps']}, at c=64: "
              f"{report['ratio_rust_c64_rps']}; added p50: {report['ratio_rust_added_p50']}")  # fmt: skip
    if "ratio_llmgw_litellm_c64_rps" in report:
        print(f"llmgw/LiteLLM req/s at c=64: {report['ratio_llmgw_litellm_c64_rps']}; "
              f"added p50: {report['ratio_llmgw_litellm_added_p50']}")  # fmt: skip


if __name__ == "__main__":
    main()
