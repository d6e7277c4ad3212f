"""The table views: nodes, GPUs, models, replicas, mirror, training jobs, batches, settings with
history, keys and usage.

Each is a widget with a ``title``, the kinds it ``needs`` fetched when shown
(those the events stream does not carry) and ``show(data, now)``, which draws
it again from :class:`~llmgw.console.state.ClusterData`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

from textual.containers import Vertical
from textual.widgets import DataTable, Label

from llmgw.console.state import ClusterData, GpuReading
from llmgw.core.mig import device_label
from llmgw.core.providers import served_outside

Row = Sequence[object]


def _fill(table: DataTable[object], rows: Iterable[Row]) -> None:
    table.clear()
    for row in rows:
        table.add_row(*(str(cell) for cell in row))


def _mib(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


class TableView(DataTable[object]):
    """One table, its columns fixed, its rows drawn from the data."""

    title = ""
    headings: tuple[str, ...] = ()
    needs: tuple[str, ...] = ()

    def on_mount(self) -> None:
        self.cursor_type = "row"
        self.zebra_stripes = True
        self.add_columns(*self.headings)

    def show(self, data: ClusterData, now: float) -> None:
        _fill(self, self.lines(data))

    def lines(self, data: ClusterData) -> Iterable[Row]:
        raise NotImplementedError


class NodesView(TableView):
    title = "Nodes"
    headings = (
        "NODE",
        "CONNECTED",
        "ADDRESS",
        "CPU",
        "MEMORY",
        "GPUS",
        "REPLICAS",
        "ENGINES",
        "REFUSED SETTINGS",
    )

    def lines(self, data: ClusterData) -> Iterable[Row]:
        for n in data.nodes:
            yield (
                n.id,
                "yes" if n.connected else "AWAY",
                n.address or "-",
                n.cpu_cores,
                f"{n.memory_mb} MiB",
                ", ".join(f"{device_label(g.index)}:{g.device_class}" for g in n.gpus) or "-",
                n.replicas,
                "; ".join(n.engines) or "-",
                f"{n.refused_settings.keys}: {n.refused_settings.reason}" if n.refused_settings else "-",
            )


class GpusView(TableView):
    title = "GPUs"
    headings = ("NODE", "DEVICE", "NAME", "CLASS", "UTIL", "MEMORY USED / TOTAL (MiB)", "TEMP")
    needs = ("gpus",)

    def lines(self, data: ClusterData) -> Iterable[Row]:
        for n in data.nodes:
            for g in n.gpus:
                label = device_label(g.index)
                r = data.gpus.get((n.id, label), GpuReading())
                total = r.memory_total_mb if r.memory_total_mb is not None else g.memory_mb
                yield (
                    n.id,
                    label,
                    g.name,
                    g.device_class,
                    "-" if r.utilization is None else f"{r.utilization:.0f} %",
                    f"{_mib(r.memory_used_mb)} / {_mib(total)}",
                    "-" if r.temperature_c is None else f"{r.temperature_c:.0f} °C",
                )


class ModelsView(TableView):
    title = "Models"
    headings = ("MODEL", "ENGINE", "REPLICAS (min/max)", "READY", "ON DEMAND", "WEIGHTS", "PROBLEM")

    def lines(self, data: ClusterData) -> Iterable[Row]:
        unplaced = data.status.unplaced if data.status else {}
        for m in data.models:
            d = m.definition
            problem = m.problem or m.unplaced or unplaced.get(m.name, "") or "-"
            if d is None:
                yield (m.name, "?", "?", f"{m.ready}/{m.replicas}", "?", "?", problem)
                continue
            yield (
                m.name,
                d.profile.engine,
                f"{d.replicas.min}/{d.replicas.max}",
                f"{m.ready}/{m.replicas}",
                "yes" if d.on_demand else "no",
                d.source.sha256[:12] if d.source else served_outside(d),
                problem,
            )


class ReplicasView(TableView):
    title = "Replicas"
    headings = ("REPLICA", "MODEL", "NODE", "STATE", "COMPUTE", "PORT", "RESTARTS", "ERROR")

    def lines(self, data: ClusterData) -> Iterable[Row]:
        for r in data.replicas:
            yield (
                r.id,
                r.model,
                r.node or "-",
                r.progress or r.state,
                r.on or "-",
                r.port or "-",
                r.restarts,
                r.error[:60] or "-",
            )


class MirrorView(TableView):
    title = "Mirror"
    headings = ("FILE", "KIND", "SIZE (MiB)", "SHA256")
    needs = ("blobs",)

    def lines(self, data: ClusterData) -> Iterable[Row]:
        for b in data.blobs:
            yield (b.filename, b.kind, f"{b.size / (1 << 20):.1f}", b.sha256[:16])


class TrainingView(TableView):
    title = "Training"
    headings = ("JOB", "MODEL", "OWNER", "STATE", "WHERE", "STEP", "LOSS", "PEAK MiB", "WHY")
    needs = ("training",)

    def lines(self, data: ClusterData) -> Iterable[Row]:
        for j in data.training:
            yield (
                j.id,
                j.model,
                j.owner or "cluster",
                j.state,
                f"{j.node_id}/{j.device}" if j.node_id else f"({j.node})",
                f"{j.step}/{j.steps}" if j.steps else "-",
                f"{j.loss:.4f}" if j.steps else "-",
                _mib(j.peak_memory_bytes / (1 << 20)) if j.peak_memory_bytes else "-",
                (j.error or j.reasons or j.detail)[:60] or "-",
            )


class BatchesView(TableView):
    title = "Batches"
    headings = ("BATCH", "PLACE", "ENDPOINT", "STATUS", "PROGRESS", "FAILED", "TOKENS IN/OUT", "OUTPUT")
    needs = ("batches",)

    def lines(self, data: ClusterData) -> Iterable[Row]:
        for b in data.batches:
            answered = b.completed + b.failed
            share = f" {100 * answered // b.total:3d} %" if b.total else ""
            yield (
                b.id,
                b.owner,
                b.endpoint,
                b.status,
                f"{answered}/{b.total}{share}",
                b.failed,
                f"{b.input_tokens}/{b.output_tokens}",
                b.output_file_id or "-",
            )


class _Stacked(Vertical):
    """Two tables, one above the other, each with its label."""

    title = ""
    needs: tuple[str, ...] = ()

    def show(self, data: ClusterData, now: float) -> None:
        upper, lower = self.query(DataTable)
        _fill(upper, self.upper(data))
        _fill(lower, self.lower(data))

    def upper(self, data: ClusterData) -> Iterable[Row]:
        raise NotImplementedError

    def lower(self, data: ClusterData) -> Iterable[Row]:
        raise NotImplementedError

    def tables(self, upper: tuple[str, tuple[str, ...]], lower: tuple[str, tuple[str, ...]]):  # type: ignore[no-untyped-def]
        for label, columns in (upper, lower):
            yield Label(label, classes="table-label")
            table: DataTable[object] = DataTable(zebra_stripes=True, cursor_type="row")
            table.add_columns(*columns)
            yield table


class SettingsView(_Stacked):
    title = "Settings"
    needs = ("history",)

    def compose(self):  # type: ignore[no-untyped-def]
        yield from self.tables(
            ("Set now", ("KEY", "VALUE")), ("History, newest first", ("AT", "ACTOR", "KEY", "CHANGE"))
        )

    def upper(self, data: ClusterData) -> Iterable[Row]:
        for key, value in sorted(data.settings.items()):
            yield (key, json.dumps(value))

    def lower(self, data: ClusterData) -> Iterable[Row]:
        for c in data.history:
            change = "unset" if c.deleted else f"= {json.dumps(c.value)}"
            yield (c.at.strftime("%Y-%m-%d %H:%M:%S"), c.actor, c.key, change)


class KeysView(_Stacked):
    title = "Keys and usage"
    needs = ("usage",)

    def compose(self):  # type: ignore[no-untyped-def]
        yield from self.tables(
            ("Keys", ("KEY", "NAME", "PREFIX", "PLACE", "OWNER", "CREATED", "REVOKED")),
            (
                "Usage by key, this month and before",
                ("MONTH", "KEY", "REQUESTS", "ERRORS", "TOKENS IN", "TOKENS OUT"),
            ),
        )

    def upper(self, data: ClusterData) -> Iterable[Row]:
        for k in data.keys:
            revoked = k.revoked_at.strftime("%Y-%m-%d") if k.revoked_at else "-"
            yield (
                k.id,
                k.name,
                k.prefix,
                k.place or "-",
                k.owner or "-",
                k.created_at.strftime("%Y-%m-%d"),
                revoked,
            )

    def lower(self, data: ClusterData) -> Iterable[Row]:
        for line in reversed(data.usage.lines if data.usage else []):
            yield (
                line.start.strftime("%Y-%m"),
                line.key_name or line.key or "?",
                line.requests,
                line.errors,
                line.prompt_tokens,
                line.completion_tokens,
            )
