"""The cheapest load and upstream for the workers phase: ``wrk`` (C, epoll) and a static nginx engine.

The workers phase measures what llmgw's own processes can do; on a 2-core
machine the load generator and the engine share the cores with them, so both
must cost as little CPU as possible:

- ``wrk`` (Debian's ``wrk``) sends the POST with a Lua script (``wrk.body``,
  its headers) and prints one JSON line from its ``done`` hook: requests,
  errors, non-2xx answers, p50 and p99. Its CPU comes from ``getrusage`` of
  the children, around the run.
- ``nginx`` (Debian's ``nginx-light``) answers llama-server's paths with fixed
  bodies (``/health``, ``/metrics``, a chat completion): ``write_nginx_launcher``
  writes an executable the agent runs in place of llama-server (its
  ``engines.llamacpp.binary``), which turns llama-server's ``--host`` and
  ``--port`` into an nginx configuration and runs one nginx process (no
  master, no daemon) on them. Its run directory (configuration, pid, temp
  paths) is ``llmgw-nginx-PORT`` beside the launcher, in the benchmark's
  temporary home: one per port however often the agent starts it again, and
  removed with the home when the benchmark stops. The API key is not checked:
  the gateway always sends it.
"""

from __future__ import annotations

import json
import resource
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any

from llmgw.testing.llama_server_standin import WHOLE

METRICS = (
    "# TYPE llamacpp:requests_processing gauge\\nllamacpp:requests_processing 0\\n"
    "# TYPE llamacpp:requests_deferred gauge\\nllamacpp:requests_deferred 0\\n"
)

NGINX_CONF = """\
daemon off;
master_process off;
worker_processes 1;
pid @RUN@/nginx.pid;
error_log stderr error;
events { worker_connections 8192; }
http {
    access_log off;
    client_body_temp_path @RUN@/body;
    proxy_temp_path @RUN@/proxy;
    fastcgi_temp_path @RUN@/fastcgi;
    uwsgi_temp_path @RUN@/uwsgi;
    scgi_temp_path @RUN@/scgi;
    keepalive_requests 100000000;
    keepalive_timeout 600s;
    client_body_buffer_size 64k;
    server {
        listen @HOST@:@PORT@ reuseport backlog=4096;
        default_type application/json;
        location = /health { return 200 '{"status":"ok"}'; }
        location = /metrics { default_type text/plain; return 200 '@METRICS@'; }
        location = /v1/chat/completions { return 200 '@WHOLE@'; }
        location = /v1/completions { return 200 '@WHOLE@'; }
        location / { return 404 '{"error":{"code":404,"message":"File Not Found"}}'; }
    }
}
"""

LAUNCHER = """\
#!{python}
import os, sys
args = sys.argv[1:]
def flag(name, default):
    return args[args.index(name) + 1] if name in args else default
port = flag("--port", "8080")
run = os.path.join(os.path.dirname(os.path.abspath(__file__)), "llmgw-nginx-" + port)
os.makedirs(run, exist_ok=True)
conf = os.path.join(run, "nginx.conf")
with open(conf, "w") as out:
    out.write({conf!r}.replace("@RUN@", run).replace("@HOST@", flag("--host", "127.0.0.1"))
              .replace("@PORT@", port))
os.execv({nginx!r}, [{nginx!r}, "-e", "stderr", "-p", run, "-c", conf])
"""


def nginx_binary() -> str | None:
    """nginx's path (``/usr/sbin`` is off some users' PATH), or None."""
    return shutil.which("nginx") or shutil.which("nginx", path="/usr/sbin:/usr/local/sbin")


def write_nginx_launcher(path: Path, python: str, nginx: str) -> Path:
    """An executable at ``path`` taking llama-server's flags and running a static nginx on its port."""
    conf = NGINX_CONF.replace("@METRICS@", METRICS).replace("@WHOLE@", WHOLE.decode())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(LAUNCHER.format(python=python, conf=conf, nginx=nginx))
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


WRK_SCRIPT = """\
wrk.method = "POST"
wrk.body = {body}
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer {key}"
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '{{"count":%d,"duration_us":%d,"errors":%d,"non2xx":%d,"p50_us":%d,"p99_us":%d}}\\n',
    summary.requests, summary.duration, e.connect + e.read + e.write + e.timeout, e.status,
    latency:percentile(50), latency:percentile(99)))
end
"""


def lua_string(text: str) -> str:
    """``text`` as a Lua long string (no escapes inside)."""
    level = 0
    while f"]{'=' * level}]" in text:
        level += 1
    return f"[{'=' * level}[{text}]{'=' * level}]"


def wrk_load(wrk: str, port: int, key: str, body: Path, *, concurrency: int, duration: float,
             script_dir: Path) -> dict[str, Any]:  # fmt: skip
    """``wrk`` at ``concurrency`` connections for ``duration`` seconds, one thread: rps, p50, CPU it spent."""
    script = script_dir / "post.lua"
    script.write_text(WRK_SCRIPT.format(body=lua_string(body.read_text()), key=key))
    seconds = max(1, round(duration))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run(
        [wrk, "-t1", f"-c{concurrency}", f"-d{seconds}s", "--timeout", "10s", "-s", str(script),
         f"http://127.0.0.1:{port}/v1/chat/completions"],
        capture_output=True, text=True, timeout=seconds + 60, check=False,
    )  # fmt: skip
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"wrk failed ({out.returncode}): {out.stdout[-1000:]} {out.stderr[-1000:]}")
    figures: dict[str, Any] = json.loads(lines[-1])
    figures["rps"] = figures["count"] / (figures["duration_us"] / 1e6)
    figures["latency_us"] = {"p50": figures["p50_us"], "p99": figures["p99_us"]}
    figures["errors"] += figures["non2xx"]
    figures["load_cpu_s"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return figures
