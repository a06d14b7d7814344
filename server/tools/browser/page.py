"""The browser's pages as gpt-oss was trained to read them.

A page is text with its links written in place as `【{id}†{text}】` (`【{id}†{text}†{domain}】`
for another site), the ids numbering the page's links; the model opens a link by its id. A
view shows the page's lines (wrapped at 80 columns) numbered `L{n}: `, under a header with the
cursor (the page's place in the conversation's page stack), the title, the URL and which lines
are shown: `[3] Title (https://…)\n**viewing lines [0 - 41] of 120**\n\nL0: …`. HTML becomes
text with inscriptis (layout-aware: tables, lists and headings keep their shape; Apache-2.0,
pure Python on lxml). A page is wrapped once, when it is made; making one (`from_body`,
`find_in`, `search_results`) is the slow part of the browser, and the tool runs it in a worker
process (worker.py): everything here is plain data in, plain data out.
"""

from __future__ import annotations

import codecs
import re
import textwrap
from array import array
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from itertools import accumulate
from urllib.parse import quote, unquote, urljoin, urlsplit

import lxml.html
from inscriptis import Inscriptis
from inscriptis.model.config import ParserConfig

WRAP_WIDTH = 80
FIND_CONTEXT_LINES = 4
MAX_FIND_RESULTS = 50
LINK_TEXT = re.compile(r"【\d+†(?P<text>[^†】]+)(?:†[^†】]+)?】")
_BRACKETS = str.maketrans({"【": "〖", "】": "〗"})  # page text cannot forge link markup


class PageError(Exception):
    """A request the page cannot answer; the message is what the model reads."""


class Packed:
    """A sequence of strings kept as one string and where each ends: a page's lines or links
    cross between processes as two objects, not one per line (unpickling thousands of small
    strings would hold the event loop's thread), and take less memory."""

    __slots__ = ("_ends", "_text")

    def __init__(self, items: Iterable[str] = ()) -> None:
        parts = list(items)
        self._text = "".join(parts)
        self._ends = array("Q", accumulate(len(part) for part in parts))

    def __len__(self) -> int:
        return len(self._ends)

    def __getitem__(self, index: int) -> str:
        if not 0 <= index < len(self._ends):
            raise IndexError(index)
        start = self._ends[index - 1] if index else 0
        return self._text[start : self._ends[index]]

    def __iter__(self) -> Iterator[str]:
        return (self[index] for index in range(len(self._ends)))

    def __reduce__(self) -> tuple[Callable[[str, array[int]], Packed], tuple[str, array[int]]]:
        return _unpacked, (self._text, self._ends)

    def size(self) -> int:
        """Its UTF-8 bytes."""
        return len(self._text.encode("utf-8", "replace"))


def _unpacked(text: str, ends: array[int]) -> Packed:
    packed = Packed()
    packed._text, packed._ends = text, ends
    return packed


@dataclass(slots=True)
class Page:
    url: str
    title: str
    lines: Packed  # wrapped at WRAP_WIDTH
    links: Packed = field(default_factory=Packed)  # by link id, from 0
    lines_of: dict[int, int] = field(default_factory=dict)  # a find result's line on its page
    is_listing: bool = False  # search or find results: `find` does not apply
    size: int = 0  # the UTF-8 bytes of its lines and links: what a conversation's budget counts


def _page(
    url: str,
    title: str,
    text: str,
    *,
    links: Iterable[str] = (),
    lines_of: dict[int, int] | None = None,
    is_listing: bool = False,
) -> Page:
    """A page of `text`, wrapped, its links by id (from 0), and its size."""
    lines, targets = Packed(wrap_lines(text)), Packed(links)
    size = lines.size() + targets.size()
    return Page(url, title, lines, targets, lines_of or {}, is_listing, size)


def domain_of(url: str) -> str:
    return urlsplit(url).netloc


def wrap_lines(text: str) -> list[str]:
    lines: list[str] = []
    for line in text.split("\n"):
        wrapped = textwrap.wrap(
            line, width=WRAP_WIDTH, replace_whitespace=False, drop_whitespace=False
        )
        lines.extend(wrapped or [""])
    return lines


def from_body(body: bytes, encoding: str, content_type: str, url: str) -> Page:
    """A fetched page: HTML (or XHTML) as `from_html`, any other text as it is."""
    try:
        codecs.lookup(encoding)
    except LookupError:
        encoding = "utf-8"
    text = body.decode(encoding, errors="replace")
    if content_type in ("text/html", "application/xhtml+xml"):
        return from_html(text, url)
    return from_text(text, url)


def from_html(html: str, url: str) -> Page:
    """An HTML page as text with its links numbered."""
    try:
        root = lxml.html.fromstring(html.translate(_BRACKETS) or "<html></html>")
    except (lxml.etree.ParserError, ValueError):
        return from_text(html, url)
    title_node = root.find(".//title")
    title = (title_node.text_content().strip() if title_node is not None else "") or domain_of(url)
    for node in root.xpath("//script|//style|//noscript|//template|//svg|//math"):
        node.drop_tree()
    links: dict[int, str] = {}
    ids: dict[str, int] = {}
    here = domain_of(url)
    for anchor in root.xpath("//a[@href]"):
        href = anchor.get("href", "").strip()
        text = " ".join(anchor.text_content().split()).replace("†", "‡")
        if not text or href.startswith(("#", "mailto:", "javascript:")):
            continue
        target = urljoin(url, href)
        if urlsplit(target).scheme not in ("http", "https"):
            continue
        link_id = ids.setdefault(target, len(ids))
        links[link_id] = target
        there = domain_of(target)
        marked = f"【{link_id}†{text}】" if there == here else f"【{link_id}†{text}†{there}】"
        _replace_with_text(anchor, marked)
    text = Inscriptis(root, ParserConfig(display_links=False)).get_text()
    text = re.sub(r"[ \t]+\n", "\n", text)
    text = re.sub(r"\n{3,}", "\n\n", text).strip("\n")
    return _page(url, title, f"URL: {url}\n{text}", links=links.values())


def from_text(text: str, url: str) -> Page:
    return _page(url, domain_of(url) or url, f"URL: {url}\n{text.translate(_BRACKETS)}")


def _replace_with_text(node: lxml.html.HtmlElement, text: str) -> None:
    parent = node.getparent()
    if parent is None:
        return
    tail = node.tail or ""
    previous = node.getprevious()
    if previous is None:
        parent.text = (parent.text or "") + text + tail
    else:
        previous.tail = (previous.tail or "") + text + tail
    parent.remove(node)


@dataclass(frozen=True, slots=True)
class SearchHit:
    title: str
    url: str
    snippet: str = ""


def search_results(query: str, hits: list[SearchHit]) -> Page:
    """The results of a search as a page of links."""
    links: dict[int, str] = {}
    lines = []
    for link_id, hit in enumerate(hits):
        links[link_id] = hit.url
        title = " ".join(hit.title.split()).replace("†", "‡").translate(_BRACKETS) or hit.url
        snippet = " ".join(hit.snippet.split()).translate(_BRACKETS)
        lines.append(f"* 【{link_id}†{title}†{domain_of(hit.url)}】 {snippet}".rstrip())
    text = "\n".join(lines) if lines else f"No results for `{query}`."
    return _page("", query, text, links=links.values(), is_listing=True)


def find_in(page: Page, pattern: str) -> Page:
    """The lines of `page` that contain `pattern` (case-insensitive), each a link to its place."""
    needle = pattern.lower()
    lines = [LINK_TEXT.sub(lambda m: m.group("text"), line) for line in page.lines]
    chunks: list[str] = []
    links: dict[int, str] = {}
    lines_of: dict[int, int] = {}
    index = 0
    while index < len(lines) and len(chunks) < MAX_FIND_RESULTS:
        if needle not in lines[index].lower():
            index += 1
            continue
        match = len(chunks)
        snippet = "\n".join(lines[index : index + FIND_CONTEXT_LINES])
        chunks.append(f"# 【{match}†match at L{index}】\n{snippet}")
        links[match] = page.url
        lines_of[match] = index
        index += FIND_CONTEXT_LINES
    text = "\n\n".join(chunks) if chunks else f"No `find` results for pattern: `{pattern}`"
    return _page(
        f"{page.url}/find?pattern={quote(pattern)}",
        f"Find results for text: `{pattern}` in `{page.title}`",
        text,
        links=links.values(),
        lines_of=lines_of,
        is_listing=True,
    )


def view(page: Page, cursor: int, loc: int = 0, num_lines: int = -1, max_chars: int = 4000) -> str:
    """The page from line `loc`: `num_lines` lines, or as many as fit in `max_chars`."""
    lines = page.lines
    total = len(lines)
    if loc >= total or loc < 0:
        raise PageError(
            f"Invalid location parameter: `{loc}`. Cannot exceed page maximum of {total - 1}."
        )
    if num_lines > 0:
        end = min(loc + num_lines, total)
    else:
        end, used = loc, 0
        while end < total and (end == loc or used + len(lines[end]) + 8 <= max_chars):
            used += len(lines[end]) + 8  # "L123: " and the newline
            end += 1
    body = "\n".join(f"L{n}: {lines[n]}" for n in range(loc, end))
    header = page.title
    if page.url:
        header += f" ({unquote(page.url)[:1024]})"
    return f"[{cursor}] {header}\n**viewing lines [{loc} - {end - 1}] of {total - 1}**\n\n{body}"
