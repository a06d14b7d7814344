"""An MCP server over stdio whose one tool records each call it runs, for the approval tests.

    python -m tests.support.mcp_recorder FILE

`note(text)` appends `text` and a newline to FILE and answers `noted: <text>`: what the file
holds is exactly the calls that ran. `hold(text)` notes `text` too, then answers only once the
file FILE.go exists (a test lets it go). `recorder_config()` writes the `mcpServers` file that
names it (`rec`).
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from mcp.server.mcpserver import MCPServer

ROOT = Path(__file__).resolve().parents[2]

server = MCPServer("recorder", instructions="Takes notes.")
_file = Path(sys.argv[1]) if __name__ == "__main__" else None


@server.tool(description="Takes a note.")
def note(text: str) -> str:
    assert _file is not None
    with _file.open("a", encoding="utf-8") as out:
        out.write(text + "\n")
    return f"noted: {text}"


@server.tool(description="Takes a note, then waits to be let go.")
async def hold(text: str) -> str:
    assert _file is not None
    note(text)
    go = _file.with_name(_file.name + ".go")
    while not go.exists():
        await asyncio.sleep(0.05)
    return f"held: {text}"


def recorder_config(directory: Path, record: Path) -> Path:
    """The `mcpServers` file naming this server (`rec`) over stdio, recording into `record`."""
    stdio = {
        "command": sys.executable,
        "args": ["-m", "tests.support.mcp_recorder", str(record)],
        "env": {"PYTHONPATH": str(ROOT)},
        "cwd": str(ROOT),
    }
    path = directory / "mcp.json"
    path.write_text(json.dumps({"mcpServers": {"rec": stdio}}))
    return path


def recorded(record: Path) -> list[str]:
    """The texts of the calls that ran, in order."""
    return record.read_text(encoding="utf-8").splitlines() if record.exists() else []


if __name__ == "__main__":
    server.run("stdio")
