"""Splitting a document's text into passages: by headings and paragraphs, a few hundred tokens each.

Paragraphs (blank-line apart) are gathered into a passage until it would
pass :attr:`Splitting.max_words`; a heading (a Markdown ``#`` line) always
starts a new passage, and its text stays at the head of the passage. A
paragraph longer than a passage is cut at word boundaries. Each passage
after the first of a section repeats the last :attr:`Splitting.overlap_words`
words of the one before, so a sentence cut in two is still found whole.
Words stand in for tokens (a token is about 0.75 words in English).
Every passage keeps its character offsets into the text.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Splitting:
    max_words: int = 180
    """Words in a passage at most (about 240 tokens)."""
    overlap_words: int = 30
    """Words a passage repeats from the one before it in the same section."""


@dataclass(frozen=True, slots=True)
class Piece:
    """One passage of a document: its index from 0, its text and where it sits in the document."""

    position: int
    text: str
    start: int
    end: int


_HEADING = re.compile(r"^#{1,6}\s")
_WORD = re.compile(r"\S+")


def _paragraphs(text: str) -> list[tuple[int, int, bool]]:
    """(start, end, is heading) of each paragraph, a heading line on its own."""
    spans = []
    for block in re.finditer(r"\S(?:.*\S)?(?:\n(?!\s*\n).*\S)*", text):
        offset = block.start()
        lines = block.group().split("\n")
        run_start: int | None = None
        at = offset
        for line in lines:
            line_end = at + len(line)
            if _HEADING.match(line.lstrip()):
                if run_start is not None:
                    spans.append((run_start, at - 1, False))
                    run_start = None
                spans.append((at, line_end, True))
            elif run_start is None and line.strip():
                run_start = at
            at = line_end + 1
        if run_start is not None:
            spans.append((run_start, block.end(), False))
    return spans


def _sections(text: str) -> list[list[tuple[int, int]]]:
    """Paragraph spans grouped by section: a heading starts a new section."""
    sections: list[list[tuple[int, int]]] = [[]]
    for start, end, heading in _paragraphs(text):
        if heading and sections[-1]:
            sections.append([])
        sections[-1].append((start, end))
    return [s for s in sections if s]


def split(text: str, settings: Splitting = Splitting()) -> list[Piece]:
    """The passages of ``text``, in order."""
    words = [(m.start(), m.end()) for m in _WORD.finditer(text)]
    starts = [w[0] for w in words]
    pieces: list[Piece] = []
    limit, overlap = settings.max_words, min(settings.overlap_words, settings.max_words // 2)
    for section in _sections(text):
        current: list[tuple[int, int]] = []
        fresh = 0  # words of ``current`` no passage holds yet

        def emit() -> None:
            nonlocal current, fresh
            begin, finish = current[0][0], current[-1][1]
            pieces.append(Piece(len(pieces), text[begin:finish], begin, finish))
            current, fresh = current[len(current) - overlap :] if overlap else [], 0

        for index, (start, end) in enumerate(section):
            paragraph = words[bisect.bisect_left(starts, start) : bisect.bisect_left(starts, end)]
            alone = index == 1 and _HEADING.match(text[section[0][0] : section[0][1]]) is not None
            if fresh and len(current) + len(paragraph) > limit and not alone:  # a heading stays with its text
                emit()
            for word in paragraph:
                current.append(word)
                fresh += 1
                if len(current) >= limit:
                    emit()
        if fresh:
            emit()
    return pieces
