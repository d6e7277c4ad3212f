"""A document's text from its bytes: plain text, Markdown, HTML and PDF.

The kind follows the file's name (``.txt``, ``.md``/``.markdown``, ``.html``/``.htm``,
``.pdf``). HTML loses its tags, scripts and styles; headings keep their text
on lines of their own, so the splitter can cut there. A PDF gives the text of
each page (pypdf), pages apart by a blank line. Anything else, or a file that
does not parse, is :class:`~llmgw.errors.ValidationFailed` (400) naming the
file and what to do.
"""

from __future__ import annotations

import io
import re
from html.parser import HTMLParser
from pathlib import PurePosixPath

from llmgw.errors import ValidationFailed

KINDS = {
    ".txt": "text",
    ".text": "text",
    ".md": "markdown",
    ".markdown": "markdown",
    ".html": "html",
    ".htm": "html",
    ".pdf": "pdf",
}
"""File name endings and the kind each is read as."""

FORMATS_HINT = "upload a text (.txt), Markdown (.md), HTML (.html) or PDF (.pdf) file"


def kind_of(name: str) -> str:
    """The kind of a document called ``name``; ValidationFailed for any other ending."""
    kind = KINDS.get(PurePosixPath(name).suffix.lower())
    if kind is None:
        raise ValidationFailed([("file", f"{name!r} is not a document llmgw reads")], FORMATS_HINT)
    return kind


def extract(name: str, data: bytes) -> tuple[str, str]:
    """The kind and the text of the document ``name`` holding ``data``."""
    kind = kind_of(name)
    if kind == "pdf":
        return kind, _pdf_text(name, data)
    try:
        decoded = data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise ValidationFailed(
            [("file", f"{name!r} is not UTF-8 text (byte {error.start} cannot be read)")],
            "save the file as UTF-8 and upload it again",
        ) from None
    if kind == "html":
        return kind, html_text(decoded)
    return kind, decoded.replace("\r\n", "\n")


class _Text(HTMLParser):
    SKIPPED = frozenset({"script", "style", "noscript", "template", "head"})
    BLOCKS = frozenset(
        {"p", "div", "br", "li", "tr", "section", "article", "pre", "blockquote", "table", "ul", "ol", "hr"}
    )
    HEADINGS = frozenset({"h1", "h2", "h3", "h4", "h5", "h6", "title"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skipping = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self.SKIPPED:
            self.skipping += 1
        elif self.skipping:
            return
        elif tag in self.HEADINGS:
            self.parts.append("\n\n# ")
        elif tag in self.BLOCKS:
            self.parts.append("\n\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in self.SKIPPED:
            self.skipping = max(0, self.skipping - 1)
        elif tag in self.HEADINGS or tag in self.BLOCKS:
            self.parts.append("\n\n")

    def handle_data(self, data: str) -> None:
        if not self.skipping:
            self.parts.append(data)


def html_text(html: str) -> str:
    """The visible text of an HTML page: no tags, scripts or styles; headings as ``# ...`` lines."""
    parser = _Text()
    parser.feed(html)
    parser.close()
    text = "".join(parser.parts)
    text = re.sub(r"[ \t\r\f\v]+", " ", text)
    text = re.sub(r" *\n *", "\n", text)
    text = re.sub(r"^#\s*$", "", text, flags=re.MULTILINE)  # a heading with no text
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def _pdf_text(name: str, data: bytes) -> str:
    from pypdf import PdfReader  # imported when a PDF comes: it takes a while to import
    from pypdf.errors import PdfReadError

    try:
        reader = PdfReader(io.BytesIO(data))
        pages = [page.extract_text() or "" for page in reader.pages]
    except (PdfReadError, ValueError, KeyError, TypeError, OSError) as error:
        raise ValidationFailed(
            [("file", f"{name!r} is not a PDF llmgw can read: {error}")],
            "check that the file is a whole, unencrypted PDF, or upload its text instead",
        ) from None
    text = "\n\n".join(p.strip() for p in pages if p.strip())
    if not text:
        raise ValidationFailed(
            [("file", f"{name!r} holds no text (a scanned PDF has only images)")],
            "run it through OCR first, or upload its text instead",
        )
    return text
