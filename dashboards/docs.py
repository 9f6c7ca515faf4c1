"""The project's documentation (the Markdown files of docs/, DOCS_DIR), as pages of the portal
under /docs/: a page that points a person to a document links to it. Links between documents
lead to their pages, and headings get GitHub's anchors, so `deploy.md#sizing` works here as it
does on the repository's own pages. Raw HTML in a document is shown as text, never run."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from django.conf import settings
from django.urls import reverse
from markdown_it import MarkdownIt

# A document's name: its file's name without `.md`, as in the page's address.
NAME = re.compile(r"[a-z][a-z0-9_-]*")
# A link to another document, with its anchor if any: `deploy.md`, `agent.md#checkpoints`.
DOC_LINK = re.compile(r"(?P<name>[a-z][a-z0-9_-]*)\.md(?P<anchor>#[^\s]*)?")


@dataclass(frozen=True)
class Doc:
    name: str
    title: str
    html: str


def doc_names() -> list[str]:
    """The documents there are, by name."""
    folder = Path(settings.DOCS_DIR)
    return sorted(p.stem for p in folder.glob("*.md") if NAME.fullmatch(p.stem))


def doc(name: str) -> Doc | None:
    """The document `name`, rendered; None if there is none."""
    if not NAME.fullmatch(name):
        return None
    path = Path(settings.DOCS_DIR) / f"{name}.md"
    try:
        modified = path.stat().st_mtime_ns
    except OSError:
        return None
    return _rendered(str(path), modified, name)


def doc_titles() -> list[tuple[str, str]]:
    """(name, title) of every document, for the index."""
    return [(name, d.title) for name in doc_names() if (d := doc(name)) is not None]


@lru_cache(maxsize=64)
def _rendered(path: str, modified: int, name: str) -> Doc:
    """A document rendered once per version of its file (`modified`)."""
    text = Path(path).read_text(encoding="utf-8")
    parser = MarkdownIt("commonmark", {"html": False}).enable(["table", "strikethrough"])
    tokens = parser.parse(text)
    known = set(doc_names())
    title, anchors = name, set()
    for i, token in enumerate(tokens):
        if token.type == "heading_open":
            words = _text(tokens[i + 1])
            if token.tag == "h1" and title == name:
                title = words
            token.attrSet("id", _anchor(words, anchors))
        elif token.type == "inline":
            for child in token.children or ():
                if child.type == "link_open":
                    child.attrSet("href", _href(str(child.attrGet("href") or ""), known))
    return Doc(name=name, title=title, html=parser.renderer.render(tokens, parser.options, {}))


def _text(inline) -> str:
    return "".join(c.content for c in inline.children or () if c.type in ("text", "code_inline"))


def _anchor(words: str, taken: set[str]) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens, and
    `-1`, `-2`... after the first of a kind."""
    base = re.sub(r"[^\w\- ]", "", words.lower()).replace(" ", "-")
    anchor, n = base, 0
    while anchor in taken:
        n += 1
        anchor = f"{base}-{n}"
    taken.add(anchor)
    return anchor


def _href(href: str, known: set[str]) -> str:
    """A link to another document leads to its page; every other link is left as written."""
    match = DOC_LINK.fullmatch(href)
    if match is None or match["name"] not in known:
        return href
    return reverse("dashboards:doc", args=[match["name"]]) + (match["anchor"] or "")
