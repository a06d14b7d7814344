"""A Responses request's hosted tools run by the server: `code_interpreter` and `web_search`.

`{"type": "code_interpreter", ...}` offers gpt-oss's built-in `python` tool and
`{"type": "web_search", ...}` (or `web_search_preview`) its `browser`, both rendered in the
system message as the model was trained with them and run by the server inside the response
(`--python-tool`, `--browser-tool`). A request that asks for one the operator did not turn on
gets a 400. One exception keeps clients that always send it working: a `web_search` with
`external_web_access: false` (Codex CLI sends it by default) asks for no live web access, which
the browser (it fetches live pages) cannot honour: it is accepted and not offered.

The python kernel and the browser's page stack live per conversation: the first response of a
`previous_response_id` chain names it (`conversation_id`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from server.api.responses.items import ItemKind
from server.api.responses.schemas import ResponsesRequest
from server.contracts.errors import InvalidRequest
from server.contracts.events import ToolTarget
from server.contracts.transcript import BuiltinTool
from server.tools.base import ServerTool

# the hosted tool types of OpenAI's API -> the built-in harmony namespace that serves them
HOSTED: dict[str, Literal["python", "browser"]] = {
    "code_interpreter": "python",
    "web_search": "browser",
    "web_search_preview": "browser",
}
FLAGS = {"python": "--python-tool", "browser": "--browser-tool"}
ITEMS: dict[str, ItemKind] = {"python": "code_interpreter_call", "browser": "web_search_call"}


@dataclass
class BuiltinSetup:
    """The built-in tools this request may use: the backends by namespace, what the model sees."""

    tools: dict[str, ServerTool] = field(default_factory=dict)

    @property
    def specs(self) -> tuple[BuiltinTool, ...]:
        """In harmony's order (browser, then python), whatever order the request named them."""
        return tuple(
            BuiltinTool(name=name, description=self.tools[name].description().description)
            for name in ("browser", "python")
            if name in self.tools
        )

    def call_kind(self, target: ToolTarget) -> ItemKind | None:
        """The output item of a call to a built-in tool this request offers."""
        if target.namespace not in self.tools:
            return None
        return ITEMS[target.namespace]


def setup_builtin(request: ResponsesRequest, enabled: Mapping[str, ServerTool]) -> BuiltinSetup:
    """The request's hosted tools resolved to the operator's built-in tools; a 400 for one the
    operator did not turn on."""
    setup = BuiltinSetup()
    for index, tool in enumerate(request.tools or []):
        kind = tool.get("type")
        namespace = HOSTED.get(str(kind))
        if namespace is None or _offline_search(tool):
            continue
        backend = enabled.get(namespace)
        if backend is None:
            raise InvalidRequest(
                f"tools[{index}]: the {kind} tool is not enabled on this server (the operator "
                f"turns it on with {FLAGS[namespace]})",
                param=f"tools[{index}].type",
                code="unsupported_value",
            )
        setup.tools[namespace] = backend
    return setup


def _offline_search(tool: Mapping[str, Any]) -> bool:
    """A web search that asks for no live web access (Codex CLI's default)."""
    return tool.get("type") == "web_search" and tool.get("external_web_access") is False
