"""The server-run tools the operator turned on, built from the settings at start-up.

`build_server_tools` makes each enabled tool and says, a line each, what it can reach, or why
it is off (the python tool's sandbox cannot run here: no Linux, no bubblewrap, no user
namespaces). The app keeps the result on its state and closes it at shutdown.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field

from server.ops.settings import Settings
from server.tools.base import ServerTool
from server.tools.browser.fetch import PageFetcher
from server.tools.browser.search import SearxngSearch
from server.tools.browser.tool import BrowserTool
from server.tools.python.sandbox import Limits, SandboxUnavailable, configure
from server.tools.python.tool import PythonTool

log = logging.getLogger(__name__)


@dataclass
class ServerTools:
    """The enabled tools by harmony namespace, and what start-up said of each."""

    tools: dict[str, ServerTool] = field(default_factory=dict)
    report: list[str] = field(default_factory=list)

    async def close(self) -> None:
        for tool in self.tools.values():
            close = getattr(tool, "close", None)
            if close is not None:
                await close()


def build_server_tools(settings: Settings) -> ServerTools:
    built = ServerTools()
    if settings.python_tool:
        limits = Limits(
            timeout_s=settings.python_tool_timeout_s,
            memory_bytes=settings.python_tool_memory_mb << 20,
            cpu_cores=settings.python_tool_cpu_cores,
            data_bytes=settings.python_tool_data_mb << 20,
        )
        try:
            config = configure(
                settings.python_tool_interpreter,
                settings.python_tool_uid,
                limits,
                without_cgroup=settings.python_tool_without_cgroup,
            )
        except SandboxUnavailable as exc:
            built.report.append(f"python tool OFF: {exc}")
        else:
            built.tools["python"] = PythonTool(
                config,
                max_kernels=settings.python_tool_max_kernels,
                idle_s=settings.python_tool_idle_s,
            )
            built.report.append(
                f"python tool on: {config.interpreter} in a bubblewrap sandbox, no network, "
                f"{settings.python_tool_timeout_s:g} s a call, {config.describe()}, at most "
                f"{settings.python_tool_max_kernels} kernels"
            )
    if settings.browser_tool:
        search = SearxngSearch(settings.browser_search_url) if settings.browser_search_url else None
        fetcher = PageFetcher(allow_private=settings.browser_allow_private)
        built.tools["browser"] = BrowserTool(search, fetcher)
        reach = (
            "any address (--browser-allow-private)"
            if settings.browser_allow_private
            else "public addresses only"
        )
        where = f"search via {settings.browser_search_url}" if search else "no search provider"
        built.report.append(f"browser tool on: {where}; pages on {reach}")
    return built


async def start_server_tools(settings: Settings) -> ServerTools:
    """build_server_tools off the event loop (the sandbox probe runs a process), its report
    logged: a tool that is off is a warning."""
    built = await asyncio.to_thread(build_server_tools, settings)
    for line in built.report:
        (log.warning if " OFF: " in line else log.info)("%s", line)
    return built
