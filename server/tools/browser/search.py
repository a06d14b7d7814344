"""The browser's search provider: a SearXNG-compatible JSON endpoint the operator configures.

`GET {url}?q=QUERY&format=json` answers `{"results": [{"title", "url", "content"}, ...]}`
(SearXNG's `json` output format, which it serves once `formats` in its settings lists `json`).
The endpoint is the operator's, not the model's: it is reached directly (it may well run on
this machine), while the pages found are opened through the browser's address guard.
"""

from __future__ import annotations

import httpx

from server.tools.browser.page import SearchHit

USER_AGENT = "gpt-oss-server-browser/0.1"


class SearchError(Exception):
    """A search that failed; the message is what the model reads."""


class SearxngSearch:
    def __init__(self, url: str, *, timeout_s: float = 20.0) -> None:
        self.url = url
        self._client = httpx.AsyncClient(
            timeout=timeout_s, trust_env=False, headers={"User-Agent": USER_AGENT}
        )

    @property
    def source(self) -> str:
        return "web"

    async def search(self, query: str, topn: int) -> list[SearchHit]:
        try:
            response = await self._client.get(self.url, params={"q": query, "format": "json"})
            response.raise_for_status()
            body = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise SearchError(f"Error during search for `{query}`: {exc}") from exc
        results = body.get("results") if isinstance(body, dict) else None
        if not isinstance(results, list):
            raise SearchError(f"Error during search for `{query}`: the provider sent no results")
        hits = []
        for result in results:
            if not isinstance(result, dict) or not isinstance(result.get("url"), str):
                continue
            if not result["url"].startswith(("http://", "https://")):
                continue
            hits.append(
                SearchHit(
                    title=str(result.get("title") or ""),
                    url=result["url"],
                    snippet=str(result.get("content") or ""),
                )
            )
        return hits[:topn]

    async def close(self) -> None:
        await self._client.aclose()
