"""ResponseStore: stored responses (store=true) in SQLite, for GET and previous_response_id.

Each record holds the Response JSON as it was returned and the conversation needed to continue
it: the transcript items of all input and output so far, with the exact tokens the model
sampled, and the date pinned in the system message. A restarted server continues from the same
tokens. The store is bounded by count and by size (oldest records go first); the database is
opened on first use, in WAL mode; blocking calls run in a worker thread. It holds whole
conversations: its directory is private (0700, this user's) and its files 0600
(server.private_files); SQLite gives its -wal and -shm files the database file's mode.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from server.contracts.transcript import (
    AssistantMessage,
    DeveloperMessage,
    Item,
    Reasoning,
    ToolCall,
    ToolResult,
    UserMessage,
)
from server.private_files import private_dir, private_file

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
_ITEM_TYPES: dict[str, type[Any]] = {
    cls.__name__: cls
    for cls in (UserMessage, DeveloperMessage, Reasoning, AssistantMessage, ToolCall, ToolResult)
}
_SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    created_at REAL NOT NULL,
    bytes INTEGER NOT NULL,
    response TEXT NOT NULL,
    state TEXT NOT NULL
)
"""


@dataclass(frozen=True)
class StoredResponse:
    """One stored response and the conversation it ends."""

    id: str
    response: dict[str, Any]
    conversation: tuple[Item, ...]
    conversation_date: str | None
    # the first response of its previous_response_id chain: keys the state server-run tools
    # keep per conversation (the python kernel, the browser's pages)
    conversation_id: str | None = None


class ResponseStore:
    """SQLite-backed, bounded; safe to share between the event loop's worker threads."""

    def __init__(self, path: Path, max_entries: int = 1000, max_bytes: int = 256 << 20) -> None:
        self.path = path
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._connection: sqlite3.Connection | None = None

    async def put(self, record: StoredResponse) -> None:
        await asyncio.to_thread(self.put_sync, record)

    async def get(self, response_id: str) -> StoredResponse | None:
        return await asyncio.to_thread(self.get_sync, response_id)

    async def delete(self, response_id: str) -> bool:
        return await asyncio.to_thread(self.delete_sync, response_id)

    def put_sync(self, record: StoredResponse) -> None:
        response = json.dumps(record.response, ensure_ascii=False, separators=(",", ":"))
        state = json.dumps(
            {
                "version": FORMAT_VERSION,
                "conversation_date": record.conversation_date,
                "conversation_id": record.conversation_id,
                "items": [item_to_json(item) for item in record.conversation],
            },
            ensure_ascii=False,
            separators=(",", ":"),
        )
        size = len(response.encode()) + len(state.encode())
        with self._lock:
            connection = self._connect()
            with connection:
                connection.execute(
                    "INSERT OR REPLACE INTO responses (id, created_at, bytes, response, state) "
                    "VALUES (?, ?, ?, ?, ?)",
                    (record.id, time.time(), size, response, state),
                )
                self._evict(connection)

    def get_sync(self, response_id: str) -> StoredResponse | None:
        with self._lock:
            row = (
                self._connect()
                .execute("SELECT response, state FROM responses WHERE id = ?", (response_id,))
                .fetchone()
            )
        if row is None:
            return None
        try:
            state = json.loads(row[1])
            if state.get("version") != FORMAT_VERSION:
                raise ValueError(f"format version {state.get('version')!r}")
            return StoredResponse(
                id=response_id,
                response=json.loads(row[0]),
                conversation=tuple(item_from_json(item) for item in state["items"]),
                conversation_date=state.get("conversation_date"),
                conversation_id=state.get("conversation_id"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("stored response %s cannot be read (%s); ignoring it", response_id, exc)
            return None

    def delete_sync(self, response_id: str) -> bool:
        with self._lock:
            connection = self._connect()
            with connection:
                cursor = connection.execute("DELETE FROM responses WHERE id = ?", (response_id,))
        return cursor.rowcount > 0

    def count(self) -> int:
        with self._lock:
            row = self._connect().execute("SELECT COUNT(*) FROM responses").fetchone()
        return int(row[0])

    def close(self) -> None:
        with self._lock:
            if self._connection is not None:
                self._connection.close()
                self._connection = None

    def _connect(self) -> sqlite3.Connection:
        if self._connection is None:
            private_dir(self.path.parent)
            for suffix in ("", "-wal", "-shm"):  # files of earlier versions: made 0600
                file = self.path.with_name(self.path.name + suffix)
                if not suffix or file.exists():
                    private_file(file, tighten=True)
            connection = sqlite3.connect(self.path, check_same_thread=False)
            connection.execute("PRAGMA journal_mode=WAL")
            connection.execute("PRAGMA synchronous=NORMAL")
            connection.execute(_SCHEMA)
            self._connection = connection
            log.info("response store at %s", self.path)
        return self._connection

    def _evict(self, connection: sqlite3.Connection) -> None:
        """Drop the oldest records beyond max_entries or max_bytes (the newest always stays)."""
        rows = connection.execute("SELECT seq, bytes FROM responses ORDER BY seq DESC").fetchall()
        total = 0
        for kept, (seq, size) in enumerate(rows):
            total += size
            if kept > 0 and (kept >= self.max_entries or total > self.max_bytes):
                connection.execute("DELETE FROM responses WHERE seq <= ?", (seq,))
                return


def item_to_json(item: Item) -> dict[str, Any]:
    data = dataclasses.asdict(item)
    if data.get("tokens") is not None:
        data["tokens"] = list(data["tokens"])
    return {"kind": type(item).__name__, **data}


def item_from_json(data: dict[str, Any]) -> Item:
    cls = _ITEM_TYPES[data["kind"]]
    names = {f.name for f in dataclasses.fields(cls)}
    fields = {key: value for key, value in data.items() if key in names}
    if fields.get("tokens") is not None:
        fields["tokens"] = tuple(fields["tokens"])
    item: Item = cls(**fields)
    return item
