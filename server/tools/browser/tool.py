"""gpt-oss's `browser` tool as a server-run tool: harmony's `browser` namespace.

`browser.search {"query"}` shows the provider's results as a page of numbered links;
`browser.open {"id", "cursor", "loc", "num_lines"}` opens a link of a page by its number, a URL
(`id` a string), or scrolls a page (no `id`); `browser.find {"pattern", "cursor"}` lists the
lines of a page that contain the pattern. Every page shown goes on the conversation's page
stack; its place there is the cursor the model cites (`【{cursor}†L{from}-L{to}】`). The `item`
of each result holds a `web_search_call`'s `action` as OpenAI's API shapes it.

A conversation keeps its last MAX_PAGES pages and at most MAX_PAGE_BYTES of their text, and its
own cookie jar; pages are made in worker processes (worker.py) within the call's time limit.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from http.cookiejar import CookieJar
from typing import Any

from server.tools.base import ToolContext, ToolNamespace, ToolResult, truncate
from server.tools.browser.fetch import FetchError, PageFetcher
from server.tools.browser.page import Page, PageError, find_in, from_body, search_results, view
from server.tools.browser.search import SearchError, SearxngSearch
from server.tools.browser.worker import PageWorkers

# harmony's description of the tool as gpt-oss was trained with it
DESCRIPTION = (
    "Tool for browsing.\n"
    "The `cursor` appears in brackets before each browsing display: `[{cursor}]`.\n"
    "Cite information from the tool using the following format:\n"
    "`【{cursor}†L{line_start}(-L{line_end})?】`, for example: `【6†L9-L11】` or `【8†L3】`.\n"
    "Do not quote more than 10 words directly from the tool output.\n"
    "sources=web (default: web)"
)

MAX_PAGES = 32
MAX_PAGE_BYTES = 8 << 20


class BrowserState:
    """One conversation's page stack, the pages fetched (opened again from here) and its cookie
    jar. The stack keeps the last `max_pages` pages and at most `max_bytes` of them (Page.size; the
    newest page always), the oldest dropped first; cursors keep their numbers."""

    def __init__(self, max_pages: int = MAX_PAGES, max_bytes: int = MAX_PAGE_BYTES) -> None:
        self.max_pages = max_pages
        self.max_bytes = max_bytes
        self.stack: OrderedDict[int, Page] = OrderedDict()  # by cursor, oldest first
        self.next_cursor = 0
        self.fetched: dict[str, Page] = {}  # by the URL asked for and the URL it came from
        self.cookies = CookieJar()

    @property
    def size(self) -> int:
        """The bytes of text of the pages kept (each page once)."""
        return sum({id(page): page.size for page in self.stack.values()}.values())

    def page(self, cursor: int = -1) -> Page:
        if not self.stack:
            raise PageError("No pages to access!")
        if cursor == -1:
            return self.stack[self.next_cursor - 1]
        if cursor not in self.stack:
            first, last = next(iter(self.stack)), self.next_cursor - 1
            dropped = (
                f"Cursor `{cursor}` is no longer kept (the browser keeps its last pages). "
                if 0 <= cursor < first
                else f"Cursor `{cursor}` is out of range. "
            )
            raise PageError(f"{dropped}Available cursor indices: [{first} - {last}].")
        return self.stack[cursor]

    def show(
        self, page: Page, loc: int, num_lines: int, max_chars: int, urls: tuple[str, ...] = ()
    ) -> str:
        """The view of `page` at the next cursor, where it goes on the stack; `urls` name it
        in `fetched` while it is kept."""
        text = view(page, self.next_cursor, loc, num_lines, max_chars)
        self.stack[self.next_cursor] = page
        self.next_cursor += 1
        for url in urls:
            self.fetched[url] = page
        while len(self.stack) > 1 and (
            len(self.stack) > self.max_pages or self.size > self.max_bytes
        ):
            self.stack.popitem(last=False)
        kept = {id(page) for page in self.stack.values()}
        for url in [url for url, page in self.fetched.items() if id(page) not in kept]:
            del self.fetched[url]
        return text


class BrowserTool:
    """The `browser` namespace (a ServerTool). Pages are made in `workers` (worker.py), each
    within the call's time limit; at most `max_conversations` conversations keep their state,
    the least recently used dropped first."""

    namespace = "browser"

    def __init__(
        self,
        search: SearxngSearch | None,
        fetcher: PageFetcher,
        *,
        max_results: int = 10,
        view_chars: int = 4000,
        max_conversations: int = 256,
        max_pages: int = MAX_PAGES,
        max_page_bytes: int = MAX_PAGE_BYTES,
        workers: PageWorkers | None = None,
    ) -> None:
        self.searcher = search
        self.fetcher = fetcher
        self.max_results = max_results
        self.view_chars = view_chars
        self.max_conversations = max_conversations
        self.max_pages = max_pages
        self.max_page_bytes = max_page_bytes
        self.workers = workers or PageWorkers()
        self.workers.start()
        self._states: OrderedDict[str, BrowserState] = OrderedDict()

    def description(self) -> ToolNamespace:
        return ToolNamespace(name=self.namespace, description=DESCRIPTION, builtin="browser")

    def state(self, key: str) -> BrowserState:
        state = self._states.pop(key, None) or BrowserState(self.max_pages, self.max_page_bytes)
        self._states[key] = state
        while len(self._states) > self.max_conversations:
            self._states.popitem(last=False)
        return state

    async def call(self, name: str, arguments: str, ctx: ToolContext) -> ToolResult:
        function = name.rsplit(".", 1)[-1]
        state = self.state(ctx.conversation_id or ctx.response_id)
        limit = ctx.timeout_s
        action: dict[str, Any] = {}
        try:
            args = _arguments(arguments)
            if function == "search":
                action = {"type": "search", "query": str(args.get("query", ""))}
                text, sources = await self._search(state, action["query"], limit)
                action["sources"] = [{"type": "url", "url": url} for url in sources]
            elif function == "open":
                text, url = await self._open(state, args, limit)
                action = {"type": "open_page", "url": url}
            elif function == "find":
                action = {"type": "find_in_page", "pattern": str(args.get("pattern", ""))}
                page = state.page(_int(args.get("cursor", -1)))
                if page.is_listing:
                    raise PageError("Cannot run `find` on search results page or find results page")
                action["url"] = page.url
                found = await self.workers.run(find_in, page, action["pattern"], timeout_s=limit)
                text = state.show(found, 0, -1, self.view_chars)
            else:
                raise PageError(f"Unknown function: {function}")
        except (PageError, FetchError, SearchError) as exc:
            return ToolResult(text=str(exc), is_error=True, item={"action": action})
        text, _ = truncate(text, ctx.max_output_chars)
        return ToolResult(text=text, item={"action": action})

    async def _search(self, state: BrowserState, query: str, limit: float) -> tuple[str, list[str]]:
        if not query:
            raise PageError("`query` is required")
        if self.searcher is None:
            raise SearchError("No search provider is configured on this server.")
        hits = await self.searcher.search(query, self.max_results)
        page = await self.workers.run(search_results, query, hits, timeout_s=limit)
        return state.show(page, 0, -1, self.view_chars), [hit.url for hit in hits]

    async def _open(
        self, state: BrowserState, args: dict[str, Any], limit: float
    ) -> tuple[str, str]:
        target = args.get("id", -1)
        loc = _int(args.get("loc", -1))
        num_lines = _int(args.get("num_lines", -1))
        if isinstance(target, str) and not target.lstrip("-").isdigit():
            page = await self._fetch(state, target, limit)
            urls = (target, page.url)
            return state.show(page, max(loc, 0), num_lines, self.view_chars, urls), page.url
        link = _int(target)
        current = state.page(_int(args.get("cursor", -1)))
        if link < 0:  # scroll the page
            return state.show(current, max(loc, 0), num_lines, self.view_chars), current.url
        if not 0 <= link < len(current.links):
            raise PageError(f"Invalid link id `{link}`.")
        url = current.links[link]
        page = state.fetched.get(url) or await self._fetch(state, url, limit)
        if loc < 0:
            line = current.lines_of.get(link, 0)
            loc = line - 4 if line > 4 else 0
        return state.show(page, loc, num_lines, self.view_chars, (url, page.url)), page.url

    async def _fetch(self, state: BrowserState, url: str, limit: float) -> Page:
        fetched = await self.fetcher.get(url, state.cookies)
        return await self.workers.run(
            from_body,
            fetched.body,
            fetched.encoding,
            fetched.content_type,
            fetched.url,
            timeout_s=limit,
        )

    async def close(self) -> None:
        await self.workers.close()
        await self.fetcher.close()
        if self.searcher is not None:
            await self.searcher.close()


def _arguments(arguments: str) -> dict[str, Any]:
    if not arguments.strip():
        return {}
    try:
        parsed = json.loads(arguments)
    except ValueError as exc:
        raise PageError(f"Invalid function arguments: {exc}") from exc
    if not isinstance(parsed, dict):
        raise PageError("Invalid function arguments: expected a JSON object")
    return parsed


def _int(value: object) -> int:
    try:
        return int(value)  # type: ignore[call-overload, no-any-return]
    except (TypeError, ValueError) as exc:
        raise PageError(f"`{value}` should be an integer") from exc
