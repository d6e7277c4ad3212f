"""Documents read by kind (text, Markdown, HTML, PDF) and split into passages with offsets."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from llmgw.errors import ValidationFailed
from llmgw.knowledge.extracting import extract, html_text
from llmgw.knowledge.ingesting import parse_pairs
from llmgw.knowledge.splitting import Splitting, split
from llmgw.testing.pdfs import text_pdf


def test_html_loses_tags_scripts_and_styles_and_keeps_headings_as_lines() -> None:
    page = (
        "<html><head><title>T</title><style>p{color:red}</style></head><body>"
        "<h2>Cooling &amp; pumps</h2><script>alert('x')</script><p>Water <b>flows</b>.</p></body></html>"
    )
    assert html_text(page) == "# Cooling & pumps\n\nWater flows."


def test_a_pdf_gives_the_text_of_every_page() -> None:
    kind, text = extract("manual.pdf", text_pdf([["First page"], ["Second page"]]))
    assert (kind, text) == ("pdf", "First page\n\nSecond page")


@pytest.mark.parametrize(
    ("name", "data", "said"),
    [
        ("notes.docx", b"PK", "is not a document llmgw reads"),
        ("bad.pdf", b"%PDF-1.4 nothing", "is not a PDF llmgw can read"),
        ("empty.pdf", text_pdf([[]]), "holds no text"),
        ("latin.txt", "caf\u00e9".encode("latin-1"), "is not UTF-8"),
    ],
)
def test_a_file_that_cannot_be_read_is_refused_naming_it(name: str, data: bytes, said: str) -> None:
    with pytest.raises(ValidationFailed) as caught:
        extract(name, data)
    assert f"{name!r}" in caught.value.message and said in caught.value.message
    assert caught.value.hint


def test_a_heading_starts_a_passage_and_stays_with_its_text() -> None:
    text = "# Title\n\nIntro.\n\n## Install\n\nRun it.\n\n## Use\n\nCall it."
    assert [p.text for p in split(text)] == [
        "# Title\n\nIntro.",
        "## Install\n\nRun it.",
        "## Use\n\nCall it.",
    ]


def test_a_long_section_is_cut_with_overlap() -> None:
    text = "## Long\n\n" + " ".join(f"w{i}" for i in range(250))
    pieces = split(text, Splitting(max_words=100, overlap_words=10))
    assert [len(p.text.split()) for p in pieces] == [100, 100, 72]
    assert pieces[1].text.split()[:10] == pieces[0].text.split()[-10:]


@given(st.lists(st.text(alphabet="ab #\n", max_size=40), max_size=30))
def test_every_passage_is_the_text_between_its_offsets_and_every_word_is_in_one(parts: list[str]) -> None:
    text = "\n\n".join(parts)
    pieces = split(text, Splitting(max_words=7, overlap_words=2))
    assert [p.position for p in pieces] == list(range(len(pieces)))
    for piece in pieces:
        assert text[piece.start : piece.end] == piece.text
    covered = {i for p in pieces for i in range(p.start, p.end)}
    assert all(i in covered for i, c in enumerate(text) if not c.isspace())


def test_pairs_come_from_json_lines_and_a_bad_line_is_named() -> None:
    assert parse_pairs(b'{"question": "q", "answer": "a"}\n\n') == [("q", "a")]
    with pytest.raises(ValidationFailed, match="line 2"):
        parse_pairs(b'{"question": "q", "answer": "a"}\n{"question": "q"}\n')
