"""Prometheus text exposition format (0.0.4), read into samples: the one parser every engine's load uses.

A line is blank, a comment (``#`` first: ``# HELP``, ``# TYPE`` and any
other), or a sample::

    name{label="value",other="v"} value [timestamp]

- Label values are quoted; inside them ``\\\\``, ``\\"`` and ``\\n`` are
  escapes, and ``}``, ``,``, ``=``, ``#`` and blanks are plain characters.
  Any other backslash is kept as it is.
- Values are floats, ``+Inf``, ``-Inf`` and ``NaN`` (any case) included, kept
  as such: deciding what a non-finite value means is the reader's job.
- The optional timestamp is an integer (milliseconds since the epoch).
- Bytes that are not UTF-8 are read as U+FFFD; they can only land in label
  values or comments, since names and numbers are ASCII.

A line that is none of these raises :class:`MetricsTextError` naming the
line: an engine whose metrics cannot be read is never routed to blind.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass

_NAME = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_LABEL = re.compile(r'[ \t]*([A-Za-z_][A-Za-z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\]|\\.)*)"[ \t]*', re.DOTALL)
_NUMBER = re.compile(
    r"[+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|inf|infinity|nan)",
    re.IGNORECASE,
)
_TIMESTAMP = re.compile(r"[+-]?\d+")
_BLANKS = re.compile(r"[ \t]*")
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}


class MetricsTextError(ValueError):
    """Text that is not Prometheus's exposition format, with the line where it stops being so."""

    def __init__(self, line_number: int, why: str, line: str) -> None:
        shown = line if len(line) <= 120 else line[:117] + "..."
        super().__init__(f"line {line_number}: {why}: {shown!r}")
        self.line_number = line_number


@dataclass(frozen=True, slots=True)
class Sample:
    """One sample line."""

    name: str
    labels: tuple[tuple[str, str], ...]
    """Label names and (unescaped) values, in the order the line gives them."""
    value: float
    """The value as written: ``+Inf``, ``-Inf`` and ``NaN`` stay what they are."""
    timestamp_ms: int | None = None

    def label(self, name: str) -> str | None:
        return next((value for key, value in self.labels if key == name), None)


def parse(text: str | bytes) -> list[Sample]:
    """Every sample of ``text``; :class:`MetricsTextError` at the first line that is not the format."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", errors="replace")
    samples = []
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw.strip(" \t\r")
        if not line or line.startswith("#"):
            continue
        samples.append(_sample(number, line))
    return samples


def values_by_name(
    samples: Iterable[Sample], ranks: Collection[str] = (), shares: Collection[str] = ()
) -> dict[str, list[float]]:
    """``name -> values``, one value per sample (per label set), in the text's order.

    - ``ranks``: labels telling apart series that several ranks of one engine
      publish about the same thing (SGLang's scheduler of each pipeline
      stage, each holding the same requests). Series of a name alike but for
      these are one value: the largest.
    - ``shares``: labels that, set to anything but the empty string, mark a
      series as a share of the total published beside it under the empty
      value (SGLang's per-priority counts). Those series are left out.
    """
    values: dict[str, list[float]] = {}
    kept: dict[tuple[str, tuple[tuple[str, str], ...]], int] = {}
    for sample in samples:
        if any(value for key, value in sample.labels if key in shares):
            continue
        row = values.setdefault(sample.name, [])
        if not ranks:
            row.append(sample.value)
            continue
        rest = (sample.name, tuple(sorted((k, v) for k, v in sample.labels if k not in ranks)))
        at = kept.get(rest)
        if at is None:
            kept[rest] = len(row)
            row.append(sample.value)
        elif not math.isnan(row[at]) and (math.isnan(sample.value) or sample.value > row[at]):
            row[at] = sample.value  # a NaN is kept, for the reader to refuse
    return values


def _sample(number: int, line: str) -> Sample:
    name = _NAME.match(line)
    if name is None:
        raise MetricsTextError(number, "a sample starts with a metric name", line)
    position = name.end()
    labels: list[tuple[str, str]] = []
    if position < len(line) and line[position] == "{":
        labels, position = _labels(number, line, position + 1)
    rest = line[position:]
    if rest[:1] not in (" ", "\t"):
        raise MetricsTextError(number, "a blank must separate the name (and labels) from the value", line)
    fields = rest.split()
    if not 1 <= len(fields) <= 2:
        raise MetricsTextError(number, "a sample holds a value and at most a timestamp after it", line)
    if not _NUMBER.fullmatch(fields[0]):
        raise MetricsTextError(number, f"{fields[0]!r} is not a number", line)
    timestamp = None
    if len(fields) == 2:
        if not _TIMESTAMP.fullmatch(fields[1]):
            raise MetricsTextError(number, f"timestamp {fields[1]!r} is not an integer", line)
        timestamp = int(fields[1])
    return Sample(name.group(), tuple(labels), float(fields[0]), timestamp)


def _labels(number: int, line: str, position: int) -> tuple[list[tuple[str, str]], int]:
    """The labels from just after ``{``, and the position just after the closing ``}``."""
    labels: list[tuple[str, str]] = []
    while True:
        position = _BLANKS.match(line, position).end()  # type: ignore[union-attr]  # matches empty
        if line.startswith("}", position):
            return labels, position + 1
        label = _LABEL.match(line, position)
        if label is None:
            raise MetricsTextError(number, 'labels are name="value" pairs separated by commas', line)
        labels.append((label[1], _unescape(label[2])))
        position = label.end()
        if line.startswith(",", position):
            position += 1
        elif not line.startswith("}", position):
            raise MetricsTextError(number, "labels end with '}'", line)


def _unescape(value: str) -> str:
    if "\\" not in value:
        return value
    return re.sub(r"\\(.)", lambda match: _ESCAPES.get(match[1], match[0]), value, flags=re.DOTALL)
