"""Claude Code's first request, captured from the real CLI for the trained model's corpus.

Claude Code's system prompt and tools stay out of the repository: the corpus command
(devkit/train_tiny/corpus.py, `--claude PATH`, e.g. the tests' npm cache) runs the installed
CLI once against a local stub on 127.0.0.1 that records the request body and answers a minimal
stream, and builds its Claude Code conversations from that body.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import secrets
import subprocess
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

MODEL = "gpt-oss-20b"
PLACEHOLDER = "PLACEHOLDER-ASK"  # the prompt the capture runs; each conversation puts its ask here
DATE = "PLACEHOLDER-DATE"  # the day of the capture, in the captured text; each group draws one


def _events(model: str) -> list[dict[str, Any]]:
    """A minimal stream: one text block saying "done"."""
    message: dict[str, Any] = {
        "id": "msg_capture",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 1, "output_tokens": 1},
    }
    block = {"type": "text", "text": ""}
    delta = {"type": "text_delta", "text": "done"}
    end = {"stop_reason": "end_turn", "stop_sequence": None}
    return [
        {"type": "message_start", "message": message},
        {"type": "content_block_start", "index": 0, "content_block": block},
        {"type": "content_block_delta", "index": 0, "delta": delta},
        {"type": "content_block_stop", "index": 0},
        {"type": "message_delta", "delta": end, "usage": {"output_tokens": 1}},
        {"type": "message_stop"},
    ]


class _Stub(BaseHTTPRequestHandler):
    bodies: list[dict[str, Any]]

    def log_message(self, *args: Any) -> None:
        return

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
        if "count_tokens" in self.path:
            self._json({"input_tokens": 1})
            return
        self.bodies.append(body)
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.end_headers()
        for event in _events(str(body.get("model", MODEL))):
            self.wfile.write(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode())
        self.wfile.flush()

    def _json(self, value: dict[str, Any]) -> None:
        data = json.dumps(value).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def capture_request(binary: Path) -> dict[str, Any]:
    """The body of the /v1/messages request Claude Code sends for the prompt PLACEHOLDER, with
    fixed paths for its temporary home and working directory and DATE for the day, so that
    every capture gives the same body (on one machine: the environment block names the OS)."""
    bodies: list[dict[str, Any]] = []
    handler = type("Stub", (_Stub,), {"bodies": bodies})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with tempfile.TemporaryDirectory() as root:
            # names of hex digits only: Claude Code writes the working directory into project
            # paths with every other character as "-" (`/tmp/x_y` as `-tmp-x-y`)
            home, work = (os.path.join(root, secrets.token_hex(8)) for _ in range(2))
            os.mkdir(home, 0o700)
            os.mkdir(work, 0o700)
            env = {
                "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                "HOME": home,
                "ANTHROPIC_BASE_URL": f"http://127.0.0.1:{server.server_address[1]}",
                "ANTHROPIC_AUTH_TOKEN": "capture",
                "ANTHROPIC_MODEL": MODEL,
                "ANTHROPIC_SMALL_FAST_MODEL": MODEL,
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
                "DISABLE_AUTOUPDATER": "1",
            }
            today = datetime.date.today().isoformat()
            command = [str(binary), "-p", PLACEHOLDER, "--output-format", "json"]
            subprocess.run(command, cwd=work, env=env, check=True, capture_output=True, timeout=120)
    finally:
        server.shutdown()
        server.server_close()
    turns = [b for b in bodies if PLACEHOLDER in json.dumps(b.get("messages"))]
    if not turns:
        raise RuntimeError("Claude Code sent no request with the prompt")
    text = json.dumps({k: v for k, v in turns[0].items() if k != "metadata"})
    for path, fixed in ((work, "/home/user/project"), (home, "/home/user")):
        text = text.replace(path, fixed)  # the directories, then their names in project paths
        text = text.replace(project_name(path), project_name(fixed))
    body: dict[str, Any] = json.loads(text.replace(today, DATE))
    return body


def project_name(path: str) -> str:
    """A directory as Claude Code names its project: every character but letters and digits
    as "-"."""
    return re.sub(r"[^A-Za-z0-9]", "-", path)


def with_ask(body: dict[str, Any], ask: str, date: str) -> dict[str, Any]:
    """A copy of the captured body whose user prompt is `ask`, on `date` (YYYY-MM-DD)."""
    text = json.dumps(body).replace(PLACEHOLDER, json.dumps(ask)[1:-1]).replace(DATE, date)
    out: dict[str, Any] = json.loads(text)
    return out
