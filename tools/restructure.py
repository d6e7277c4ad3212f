"""Names and folders that show the concepts: the control plane's modules in subpackages, the agent's
shard supervisor named for what it supervises, and one word (stand-in) for the test kit's imitations.

Run from the repository root on a clean tree::

    python tools/restructure.py

Each move is a ``git mv``; then every reference in the tracked text files is rewritten, by whole
module paths only:

- imports and dotted names (``from llmgw.controlplane.fleet import``, ``import llmgw.x.y``,
  ``"llmgw.controlplane.fleet.time"`` in ``mock.patch`` and ``monkeypatch``, ``:mod:`` roles,
  ``python -m llmgw.testing.fake_vllm``, pyproject.toml's contracts);
- ``from llmgw.testing import fake_vllm, sshd`` split so each module is imported from where it now
  is, and, where the module's name changed and it was imported unaliased, the name as used in
  that file (``fake_vllm.main`` -> ``vllm_standin.main``);
- file paths (``controlplane/fleet.py``, ``src/llmgw/...``, ``../src/llmgw/...``, and
  ``SRC / "controlplane" / "fleet.py"`` joins), and the stand-ins' own file names where they
  appear alone (each is unique in the tree);
- the agent's ``Supervisor`` where it is the agent's (imported from ``llmgw.agent.supervising``,
  or named by its full path, or beside ``agent/supervising.py`` in the docs).

It runs again without changing anything (a move already made is skipped, a rewritten name is
not matched again), and prints what it did.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

CP = "llmgw.controlplane"
TK = "llmgw.testing"

# Each new subpackage of the control plane, with what it holds (its __init__.py's docstring).
PACKAGES: dict[str, str] = {
    f"{CP}.admin": (
        "The admin side of the HTTP port: the ``/api`` app over the routers of ``controlplane/api/``,\n"
        "who calls it (the admin token and users' tokens, known in memory), what a request must bring\n"
        "before its body is read (admission), and the publisher of what changed behind\n"
        "``GET /api/events``."
    ),
    f"{CP}.serving": (
        "Serving the HTTP port: the uvicorn server, the gateway built from ``server.yaml`` (one\n"
        "builder for the control plane and its workers), a standby relaying ``/api`` and ``/v1`` to\n"
        "the leader and the leader answering them in process, and the gateway worker processes\n"
        "(started, restarted and stopped by their control plane, each serving ``/v1`` itself)."
    ),
    f"{CP}.statesharing": (
        "The gateway's state shared from one plane to another: its typed events and their codec, the\n"
        "one server and one follower of the state protocol, the state they record and apply, and\n"
        "the two channels it runs over (the gRPC stream from the leader to each standby, the Unix\n"
        "socket from a control plane to each of its gateway workers)."
    ),
    f"{CP}.lifecycle": (
        "Who leads and how the processes start again: the leader lease, the duties started and\n"
        "stopped with it, a control plane re-executing itself, ``llmgw restart`` taking the cluster\n"
        "one process at a time, and agents rolled onto a signed release one node at a time."
    ),
    f"{CP}.nodes": (
        "The nodes and what they tell the leader: the fleet (observed state, in memory), each node's\n"
        "stream (registration, shard status, heartbeats), registrations recorded in the store,\n"
        "settings sent to each node, logs read through its stream, each card's recent readings,\n"
        "and the firewall part computed from the nodes and control planes."
    ),
    f"{CP}.replicas": (
        "Making the replicas running match the catalog: the reconciler, how many replicas a model\n"
        "wants (its demand, the load, autoscaling), where new ones go, what a node is sent to start\n"
        "one, replicas spread over several nodes, rolling replicas onto new adapters, and the\n"
        "reconciler's traces."
    ),
    f"{CP}.accounting": (
        "What requests used and the limits they count against: usage summed and written to the\n"
        "store in batches (spilled to disk while the store is away), the tokens counted against\n"
        "day and month budgets, and every rate and concurrency limit divided between the planes\n"
        "serving ``/v1``."
    ),
    f"{CP}.training": (
        "Training jobs on the control plane: the scheduler (a leader duty that places queued jobs,\n"
        "follows them and collects their results), the collecting of a finished job's files into\n"
        "the mirror, and what a job's messages carry."
    ),
    f"{CP}.mirror": (
        "The mirror across control planes: each plane pulling the blobs it lacks from its peers,\n"
        "and which caller of FetchBlob may have which blob."
    ),
    f"{CP}.metrics": (
        "What the control plane's ``/metrics`` serves: the cluster's state (nodes, replicas,\n"
        "leadership, reconcile passes, the store) and, behind gateway workers, their gateway\n"
        "samples added."
    ),
}

_GROUPS: dict[str, list[str]] = {
    "admin": ["admin:app", "callers", "changes", "admission"],
    "serving": ["httpserving", "gatewaybuilding", "relaying", "asgi_calls", "workers", "workerserving"],
    "statesharing": ["stateevents", "stateprotocol", "gatewaystate", "statestream", "localchannel"],
    "lifecycle": ["leadership", "leaderduties", "selfrestart", "clusterrestart", "upgrading"],
    "nodes": [
        "fleet",
        "sessions",
        "noderecording",
        "agentsettings",
        "logreading",
        "gpu_history",
        "firewalling",
    ],
    "replicas": [
        "reconciling",
        "placing",
        "replicacount",
        "demand",
        "shardspecs",
        "multinode",
        "adapterrolling",
        "reconciletracing",
    ],
    "accounting": ["usage_writing", "usage_spilling", "limit_counting", "limit_sharing"],
    "training": ["training:scheduling", "trainingcollect:collecting", "trainingprogress:progress"],
    "mirror": ["mirror_replicating:replicating", "blobaccess"],
    "metrics": ["clustermetrics", "workermetrics"],
}

# Old module -> new module.
MOVES: dict[str, str] = {}
for _group, _names in _GROUPS.items():
    for _entry in _names:
        _old, _, _new = _entry.partition(":")
        MOVES[f"{CP}.{_old}"] = f"{CP}.{_group}.{_new or _old}"

# The test kit: fake_* and *_standin were one idea under two words; it is a stand-in.
for _old, _new in {
    "fake_comfyui": "comfyui_standin",
    "fake_hf_hub": "hf_hub_standin",
    "fake_nvidia_smi": "nvidia_smi_standin",
    "fake_nvml": "nvml_standin",
    "fake_ollama_registry": "ollama_registry_standin",
    "fake_ray": "ray_standin",
    "fake_sglang": "sglang_standin",
    "fake_trainer": "trainer_standin",
    "fake_trtllm": "trtllm_standin",
    "fake_vllm": "vllm_standin",
    "fakebuild": "standin_builds",
}.items():
    MOVES[f"{TK}.{_old}"] = f"{TK}.{_new}"

# Files that are not modules of llmgw (tests named after a renamed module).
FILE_MOVES: dict[str, str] = {
    "tests/engines/test_fake_ray.py": "tests/engines/test_ray_standin.py",
}

# The agent's Supervisor supervises the node's shards (engine processes).
AGENT_SUPERVISING = "llmgw.agent.supervising"
OLD_CLASS, NEW_CLASS = "Supervisor", "ShardSupervisor"

# The folder map of docs/architecture.md: its rows for the folders whose insides changed.
ARCHITECTURE = "docs/architecture.md"
ARCHITECTURE_ROWS: dict[str, str] = {
    "| `controlplane/` |": (
        "| `controlplane/` | the control plane: `config.py` (server.yaml), `wiring.py` (its parts, built in "
        "dependency order), `running.py` (the process), `api/` (the admin API's routers: each route checks "
        "the caller's role, docs/tenancy.md), and by concept `admin/` (the `/api` app, callers, admission, "
        "the change publisher behind `/api/events`), `serving/` (the HTTP server, the gateway builder, the "
        "standby relay, the gateway workers), `statesharing/` (the gateway state protocol: its events, its "
        "server and follower, the stream to standbys and the local channel to workers), `lifecycle/` "
        "(leadership, leader duties, restarts: `llmgw restart` one process at a time, a control plane "
        "re-executing itself; agent upgrades), `nodes/` (the fleet, node sessions, node settings, logs, GPU "
        "history, the firewall part), `replicas/` (the reconciler, replica counts, placement, shard specs, "
        "multi-node replicas, adapter rolls), `accounting/` (usage writing, limit counts and shares), "
        "`training/` (the training scheduler), `mirror/` (mirror replication, blob access), `metrics/` "
        "(`/metrics`) |"
    ),
}
ARCHITECTURE_PHRASES: dict[str, str] = {
    "engine stand-ins, fake nvidia-smi and NVML,": "stand-ins for engines, nvidia-smi, NVML and registries,",
}

CONTROLPLANE_INIT = "src/llmgw/controlplane/__init__.py"
CONTROLPLANE_INIT_OLD = '"""llmgw.controlplane."""\n'
CONTROLPLANE_INIT_NEW = (
    '"""The control plane: leads the cluster, serves the HTTP port, and keeps the nodes\' replicas\n'
    "matching the catalog.\n\n"
    "``config.py`` reads server.yaml, ``wiring.py`` builds the parts and ``running.py`` runs the process;\n"
    "``api/`` holds the admin API's routers. Each subpackage holds one concept (its ``__init__.py``\n"
    'says which); none re-exports anything: import a module by its full path.\n"""\n'
)

# Lines the longer paths take past the line length, wrapped (the text as the rules leave it).
WRAPS: dict[str, list[tuple[str, str]]] = {
    "src/llmgw/controlplane/admin/admission.py": [
        (
            "(:mod:`llmgw.controlplane.serving.httpserving`), then closes. Each ``/api`` route still checks"
            " the token itself\n",
            "(:mod:`llmgw.controlplane.serving.httpserving`), then closes. Each ``/api`` route still checks\n"
            "the token itself\n",
        )
    ],
    "src/llmgw/controlplane/mirror/replicating.py": [
        (
            '    """The control planes as leadership last saw them'
            ' (:class:`~llmgw.controlplane.lifecycle.leadership.Leadership`)."""',
            '    """The control planes as leadership last saw them\n'
            '    (:class:`~llmgw.controlplane.lifecycle.leadership.Leadership`)."""',
        )
    ],
    "src/llmgw/controlplane/nodes/sessions.py": [
        (
            '        """Given a node\'s training status or piece of a result'
            ' (:mod:`llmgw.controlplane.training.scheduling`)."""',
            '        """Given a node\'s training status or piece of a result\n'
            '        (:mod:`llmgw.controlplane.training.scheduling`)."""',
        )
    ],
    "src/llmgw/protocol/channels.py": [
        (
            '"""Either side of a gateway state stream: one frame of the state protocol'
            ' (``controlplane/statesharing/stateevents.py``,\nits one codec) per message, both ways."""',
            '"""Either side of a gateway state stream: one frame of the state protocol\n'
            '(``controlplane/statesharing/stateevents.py``, its one codec) per message, both ways."""',
        )
    ],
    "tests/protocol/test_grpc_state.py": [
        (
            "The leader's side is a handler here (the control plane's is"
            " ``controlplane/statesharing/statestream.py``, tested in\n"
            "memory in tests/controlplane/test_state_stream.py); the frames are opaque to the channel",
            "The leader's side is a handler here (the control plane's is\n"
            "``controlplane/statesharing/statestream.py``, tested in memory in\n"
            "tests/controlplane/test_state_stream.py); the frames are opaque to the channel",
        )
    ],
}

TEXT_SUFFIXES = {
    ".py",
    ".pyi",
    ".md",
    ".toml",
    ".proto",
    ".yaml",
    ".yml",
    ".txt",
    ".cfg",
    ".ini",
    ".sh",
    ".json",
}
TEXT_NAMES = {"Makefile"}
SELF = "tools/restructure.py"
LINE_LENGTH = 110  # pyproject.toml's [tool.ruff] line-length


def module_file(module: str) -> str:
    return "src/" + module.replace(".", "/") + ".py"


def package_dir(package: str) -> str:
    return "src/" + package.replace(".", "/")


def git(*args: str) -> str:
    return subprocess.run(["git", *args], check=True, capture_output=True, text=True).stdout


def _guard(old: str) -> str:
    """A lookahead that keeps ``old`` from matching the start of a module now below it (``admin`` ->
    ``admin.app``: a second run must not take ``admin.app`` for ``admin``)."""
    below = sorted({new[len(old) + 1 :].split(".")[0] for new in MOVES.values() if new.startswith(old + ".")})
    return f"(?!\\.(?:{'|'.join(map(re.escape, below))})(?!\\w))" if below else ""


def _build_rules() -> list[tuple[re.Pattern[str], str, str]]:
    rules: list[tuple[re.Pattern[str], str, str]] = []
    for old, new in sorted(MOVES.items(), key=lambda item: -len(item[0])):
        guard = _guard(old)
        # dotted: llmgw.controlplane.fleet (.Fleet), in imports, strings, roles, -m
        rules.append((re.compile(rf"(?<![\w.]){re.escape(old)}(?!\w){guard}"), new, "dotted"))
        # a Markdown heading's anchor: #...-llmgwtestingfake_comfyui
        rules.append(
            (re.compile(rf"(?<=[#-]){re.escape(old.replace('.', ''))}(?!\w)"), new.replace(".", ""), "anchor")
        )
        old_rel = old.removeprefix("llmgw.").replace(".", "/") + ".py"
        new_rel = new.removeprefix("llmgw.").replace(".", "/") + ".py"
        # paths: controlplane/fleet.py, llmgw/..., src/llmgw/..., ../src/llmgw/...
        rules.append(
            (
                re.compile(rf"(?<![\w/.-])((?:\.\./)*(?:src/)?(?:llmgw/)?){re.escape(old_rel)}(?!\w)"),
                rf"\g<1>{new_rel}",
                "path",
            )
        )
        # Path joins: "controlplane" / "fleet.py"
        old_parts, new_parts = old_rel.split("/"), new_rel.split("/")
        joined = r"\s*/\s*".join(f'"{re.escape(part)}"' for part in old_parts)
        rules.append(
            (re.compile(rf"(?<![\w\"]){joined}"), " / ".join(f'"{p}"' for p in new_parts), "path-join")
        )
        if old.startswith(TK + "."):
            # a stand-in's file name alone (each is unique in the tree)
            old_base, new_base = old_parts[-1], new_parts[-1]
            rules.append((re.compile(rf"(?<![\w/.-]){re.escape(old_base)}(?!\w)"), new_base, "file-name"))
            # ...its module path without llmgw. (testing.fake_trainer), and its name quoted in the docs
            old_name, new_name = old.rsplit(".", 1)[1], new.rsplit(".", 1)[1]
            rules.append(
                (
                    re.compile(rf"(?<![\w.])testing\.{re.escape(old_name)}(?!\w)"),
                    f"testing.{new_name}",
                    "dotted",
                )
            )
            rules.append((re.compile(rf"(?<=`){re.escape(old_name)}(?=`)"), new_name, "name"))
    for old_path, new_path in FILE_MOVES.items():
        rules.append(
            (re.compile(rf"(?<![\w/.-])((?:\.\./)*){re.escape(old_path)}(?!\w)"), rf"\g<1>{new_path}", "path")
        )
    return rules


_FROM_IMPORT = re.compile(
    r"^(?P<indent>[ \t]*)from (?P<parent>llmgw(?:\.\w+)*) import (?P<names>\([^)]*\)|[^\n]*)$", re.MULTILINE
)


def _split_from_imports(text: str) -> tuple[str, dict[str, str]]:
    """``from P import a, b`` where ``P.a`` moved: each moved module imported from its new parent.
    Answers the text and the names to rename in the file (a module imported unaliased whose name
    changed)."""
    renamed: dict[str, str] = {}

    def replace(match: re.Match[str]) -> str:
        parent, body, indent = match["parent"], match["names"], match["indent"]
        inner = body[1:-1] if body.startswith("(") else body
        comment = ""
        if not body.startswith("(") and "#" in inner:
            inner, comment = inner.split("#", 1)
            comment = "  #" + comment
        if "#" in inner:  # a comment inside a parenthesised list: left for a person
            if any(f"{parent}.{n.split()[0]}" in MOVES for n in _names(inner.replace("#", "\n#"))):
                print(f"  ! left alone (a comment in the import list): {match[0]!r}")
            return match[0]
        names = _names(inner)
        if not any(f"{parent}.{name.split()[0]}" in MOVES for name in names):
            return match[0]
        kept: list[str] = []
        moved: dict[str, list[str]] = {}
        for name in names:
            words = name.split()
            new = MOVES.get(f"{parent}.{words[0]}")
            if new is None:
                kept.append(name)
                continue
            new_parent, new_name = new.rsplit(".", 1)
            alias = f" as {words[2]}" if len(words) == 3 else ""
            if not alias and new_name != words[0]:
                renamed[words[0]] = new_name
            if new_parent == parent:
                kept.append(new_name + alias)
            else:
                moved.setdefault(new_parent, []).append(new_name + alias)
        lines = []
        if kept:
            lines.append(f"{indent}from {parent} import {', '.join(kept)}")
        lines += [f"{indent}from {p} import {', '.join(ns)}" for p, ns in moved.items()]
        lines[0] += comment.rstrip()
        return "\n".join(lines)

    return _FROM_IMPORT.sub(replace, text), renamed


def _names(inner: str) -> list[str]:
    parts = [" ".join(part.split()) for part in inner.replace("\\\n", " ").replace("\n", " ").split(",")]
    return [part for part in parts if part and not part.startswith("#")]


_AGENT_IMPORT = re.compile(
    rf"^[ \t]*from {re.escape(AGENT_SUPERVISING)} import (\([^)]*\)|[^\n]*)$", re.MULTILINE
)
_RUNTIME_IMPORT = re.compile(
    r"^[ \t]*from llmgw\.runtime\.supervising import (\([^)]*\)|[^\n]*)$", re.MULTILINE
)
_BARE_CLASS = re.compile(rf"(?<![\w.]){OLD_CLASS}(?!\w)")


def _rename_agent_supervisor(path: str, text: str) -> str:
    text = re.sub(  # a role's shown name: :class:`Supervisor <llmgw.agent.supervising.Supervisor>`
        rf"(?<![\w.]){OLD_CLASS} <(~?){re.escape(AGENT_SUPERVISING)}\.(?:{OLD_CLASS}|{NEW_CLASS})>",
        rf"{NEW_CLASS} <\g<1>{AGENT_SUPERVISING}.{NEW_CLASS}>",
        text,
    )
    text = re.sub(
        rf"(?<![\w.]){re.escape(AGENT_SUPERVISING)}\.{OLD_CLASS}(?!\w)",
        f"{AGENT_SUPERVISING}.{NEW_CLASS}",
        text,
    )
    if path.endswith(".md"):
        lines = text.split("\n")
        for i, line in enumerate(lines):
            if "agent/supervising.py" in line:
                lines[i] = _BARE_CLASS.sub(NEW_CLASS, line)
        return "\n".join(lines)
    if not path.endswith(".py"):
        return text
    defines = path == module_file(AGENT_SUPERVISING)
    imports = any(OLD_CLASS in _names(m[1].strip("()")) for m in _AGENT_IMPORT.finditer(text))
    # the import itself, aliased or not (``Supervisor as Shards``: the file's own name is kept)
    text = _AGENT_IMPORT.sub(lambda m: _BARE_CLASS.sub(NEW_CLASS, m[0]), text)
    if not (defines or imports):
        return text
    if any(OLD_CLASS in _names(m[1].strip("()")) for m in _RUNTIME_IMPORT.finditer(text)):
        print(f"  ! {path}: imports both Supervisors; left for a person")
        return text
    return _BARE_CLASS.sub(NEW_CLASS, text)


def _is_text(path: str) -> bool:
    p = Path(path)
    return p.suffix in TEXT_SUFFIXES or p.name in TEXT_NAMES


def main() -> int:
    if not Path(".git").exists() or not Path("src/llmgw").is_dir():
        print("run this from the root of llmgw's repository", file=sys.stderr)
        return 2
    if git("status", "--porcelain").strip():
        print("the tree has changes: commit or stash them first (the moves are git mv)", file=sys.stderr)
        return 2

    print("packages:")
    for package, doc in PACKAGES.items():
        init = Path(package_dir(package)) / "__init__.py"
        if init.exists():
            continue
        init.parent.mkdir(parents=True, exist_ok=True)
        init.write_text(f'"""{doc}\n"""\n')
        git("add", str(init))
        print(f"  + {init}")

    print("moves:")
    moves = {module_file(o): module_file(n) for o, n in MOVES.items()} | FILE_MOVES
    for old_path, new_path in moves.items():
        old, new = Path(old_path), Path(new_path)
        if old.exists() and new.exists():
            print(f"  ! both {old} and {new} exist; left alone", file=sys.stderr)
            continue
        if not old.exists():
            if not new.exists():
                print(f"  ? {old} is not here (nor {new})")
            continue
        new.parent.mkdir(parents=True, exist_ok=True)
        git("mv", str(old), str(new))
        print(f"  {old} -> {new}")

    print("references:")
    rules = _build_rules()
    long_lines: list[str] = []
    for path in git("ls-files").splitlines():
        if path == SELF or not _is_text(path) or not Path(path).is_file():
            continue
        try:
            text = Path(path).read_text()
        except UnicodeDecodeError:
            continue
        new_text = text
        counts: dict[str, int] = {}
        if path.endswith((".py", ".pyi")):
            new_text, renamed = _split_from_imports(new_text)
            if new_text != text:
                counts["from-import"] = 1
            for old_name, new_name in renamed.items():
                new_text, n = re.subn(rf"(?<![\w.]){re.escape(old_name)}(?!\w)", new_name, new_text)
                counts["name"] = counts.get("name", 0) + n
        for pattern, replacement, kind in rules:
            new_text, n = pattern.subn(replacement, new_text)
            if n:
                counts[kind] = counts.get(kind, 0) + n
        after_class = _rename_agent_supervisor(path, new_text)
        if after_class != new_text:
            counts[NEW_CLASS] = 1
            new_text = after_class
        if path == ARCHITECTURE:
            lines = new_text.split("\n")
            for i, line in enumerate(lines):
                for prefix, row in ARCHITECTURE_ROWS.items():
                    if line.startswith(prefix) and line != row:
                        lines[i] = row
                        counts["folder-map"] = counts.get("folder-map", 0) + 1
            new_text = "\n".join(lines)
            for old_phrase, new_phrase in ARCHITECTURE_PHRASES.items():
                if old_phrase in new_text:
                    new_text = new_text.replace(old_phrase, new_phrase)
                    counts["folder-map"] = counts.get("folder-map", 0) + 1
        for long, wrapped in WRAPS.get(path, []):
            if long in new_text:
                new_text = new_text.replace(long, wrapped)
                counts["wrapped"] = counts.get("wrapped", 0) + 1
        if path == CONTROLPLANE_INIT and new_text == CONTROLPLANE_INIT_OLD:
            new_text = CONTROLPLANE_INIT_NEW
            counts["docstring"] = 1
        if new_text != text:
            Path(path).write_text(new_text)
            print(f"  {path}: " + ", ".join(f"{kind} {n}" for kind, n in sorted(counts.items())))
            was_long = {line for line in text.split("\n") if len(line) > LINE_LENGTH}
            for number, line in enumerate(new_text.split("\n"), 1):
                if path.endswith((".py", ".pyi")) and len(line) > LINE_LENGTH and line not in was_long:
                    long_lines.append(f"{path}:{number}")
    for where in long_lines:
        print(
            f"  ! {where}: longer than {LINE_LENGTH} characters now"
            " (ruff format wraps code; wrap a docstring or comment by hand)"
        )
    print("done; then: ruff check --fix and ruff format on the changed files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
