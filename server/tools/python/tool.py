"""gpt-oss's `python` tool as a server-run tool: harmony's `python` namespace, run in a sandbox.

The model calls it from its analysis channel with the code as the message's content; it reads
back what a notebook cell prints (the last expression's value included), in a kernel kept for
the conversation (kernels.py) inside a bubblewrap sandbox (sandbox.py). The `item` of each
result holds a `code_interpreter_call`'s fields as OpenAI's API shapes them (`code`,
`container_id`, `outputs` of type `logs`).
"""

from __future__ import annotations

import hashlib
import json

from server.tools.base import ToolContext, ToolNamespace, ToolResult, truncate
from server.tools.python.kernels import KILL_GRACE_S, Execution, KernelPool
from server.tools.python.sandbox import SCRATCH_MOUNT, SandboxConfig

NO_OUTPUT = (
    "[WARN] No output available. Use print() to output anything to stdout to receive the output"
)
BUSY = "[ERROR] every python session of this server is busy; try again later"

# harmony's description of the tool as gpt-oss was trained with it, with this server's facts
DESCRIPTION = (
    "Use this tool to execute Python code in your chain of thought. The code will not be shown "
    "to the user. This tool should be used for internal reasoning, but not for code that is "
    "intended to be visible to the user (e.g. when creating plots, tables, or files).\n\n"
    "When you send a message containing Python code to python, it will be executed in a "
    "stateful Jupyter notebook environment. python will respond with the output of the "
    "execution or time out after {timeout:.1f} seconds. The drive at '{scratch}' can be used "
    "to save and persist user files. Internet access for this session is disabled."
)


class PythonTool:
    """The `python` namespace (a ServerTool)."""

    namespace = "python"

    def __init__(self, config: SandboxConfig, *, max_kernels: int = 4, idle_s: float = 600.0):
        self.config = config
        self.pool = KernelPool(config, max_kernels=max_kernels, idle_s=idle_s)

    def description(self) -> ToolNamespace:
        text = DESCRIPTION.format(timeout=self.config.limits.timeout_s, scratch=SCRATCH_MOUNT)
        return ToolNamespace(name=self.namespace, description=text, builtin="python")

    async def call(self, name: str, arguments: str, ctx: ToolContext) -> ToolResult:
        code = _code(arguments)
        key = ctx.conversation_id or ctx.response_id
        # leave the core's own deadline room for the kill and the answer
        timeout = min(self.config.limits.timeout_s, max(ctx.timeout_s - KILL_GRACE_S - 1, 1.0))
        execution = await self.pool.run(key, code, timeout)
        item: dict[str, object] = {"code": code, "container_id": container_id(key)}
        if execution is None:
            return ToolResult(text=BUSY, is_error=True, item=item)
        text = _render(execution, ctx.max_output_chars)
        item["outputs"] = [{"type": "logs", "logs": text}]
        return ToolResult(text=text, is_error=not execution.ok, item=item)

    async def close(self) -> None:
        await self.pool.close()


def _code(arguments: str) -> str:
    """The cell's code: the message's content; also from `{"code": ...}`, which the model
    sometimes writes as if python were a function."""
    stripped = arguments.strip()
    if stripped.startswith("{"):
        try:
            parsed = json.loads(stripped)
        except ValueError:
            return arguments
        if isinstance(parsed, dict) and set(parsed) == {"code"} and isinstance(parsed["code"], str):
            return parsed["code"]
    return arguments


def _render(execution: Execution, max_chars: int) -> str:
    """The cell's output (cut to `max_chars`) and what the model must know of how it ended."""
    text, _ = truncate(execution.output, max_chars)
    if execution.omitted_bytes:
        text = text.rstrip("\n") + (
            f"\n[{execution.omitted_bytes} more bytes of output were dropped: "
            "print less, or write large results to a file]"
        )
    if execution.ended is not None:
        text = text.rstrip("\n") + (
            f"\n[{execution.ended}; its variables are lost, the files in {SCRATCH_MOUNT} are "
            "kept, and the next call starts a new session]"
        )
    if not text.strip():
        return NO_OUTPUT
    return text.lstrip("\n")


def container_id(key: str) -> str:
    """A stable, opaque id for the conversation's sandbox."""
    return "cntr_" + hashlib.sha256(key.encode("utf-8")).hexdigest()[:24]
