"""ResponseStore: SQLite persistence of responses and their exact-token conversations; dates."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

from server.api.responses.router import ResponsesState
from server.api.responses.store import ResponseStore, StoredResponse, item_from_json, item_to_json
from server.contracts.transcript import (
    AssistantMessage,
    DeveloperMessage,
    Item,
    Reasoning,
    ToolCall,
    ToolResult,
    UserMessage,
)

CONVERSATION: tuple[Item, ...] = (
    DeveloperMessage("Be terse."),
    UserMessage("Run ls"),
    Reasoning("Need ls.", tokens=(200006, 1, 2, 200007)),
    ToolCall("call_1", "close_agent", "{}", "multi_agent_v1", "<|constrain|>json", (3, 200012)),
    ToolResult("call_1", "ok", "close_agent", "multi_agent_v1"),
    AssistantMessage("Done.", channel="final", tokens=(200006, 4, 200007)),
    AssistantMessage("Working.", channel="commentary"),
)


def record(response_id: str, padding: str = "") -> StoredResponse:
    return StoredResponse(
        id=response_id,
        response={"id": response_id, "object": "response", "output": [], "pad": padding},
        conversation=CONVERSATION,
        conversation_date="2026-11-21",
    )


def test_items_round_trip_with_their_tokens() -> None:
    for item in CONVERSATION:
        assert item_from_json(item_to_json(item)) == item
    assert item_to_json(CONVERSATION[2]) == {
        "kind": "Reasoning",
        "text": "Need ls.",
        "tokens": [200006, 1, 2, 200007],
    }


def test_put_get_delete_and_restart(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "responses.sqlite3"
    store = ResponseStore(path)
    assert not path.exists()  # opened on first use only
    asyncio.run(store.put(record("resp_a")))
    assert asyncio.run(store.get("resp_a")) == record("resp_a")
    assert asyncio.run(store.get("resp_missing")) is None
    store.close()
    reopened = ResponseStore(path)  # a restarted server
    assert reopened.get_sync("resp_a") == record("resp_a")
    assert asyncio.run(reopened.delete("resp_a")) is True
    assert asyncio.run(reopened.delete("resp_a")) is False
    assert reopened.get_sync("resp_a") is None
    mode = sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"
    reopened.close()


def test_bounded_by_count_oldest_first(tmp_path: Path) -> None:
    store = ResponseStore(tmp_path / "r.sqlite3", max_entries=3)
    for n in range(5):
        store.put_sync(record(f"resp_{n}"))
    assert store.count() == 3
    assert store.get_sync("resp_1") is None
    assert [store.get_sync(f"resp_{n}") is not None for n in (2, 3, 4)] == [True] * 3


def test_bounded_by_size_keeps_the_newest(tmp_path: Path) -> None:
    store = ResponseStore(tmp_path / "r.sqlite3", max_bytes=5000)
    store.put_sync(record("resp_small"))
    store.put_sync(record("resp_big", "x" * 3000))
    assert store.count() == 2
    store.put_sync(record("resp_bigger", "y" * 4000))
    assert store.count() == 1  # over the limit alone, still kept: it is the newest
    assert store.get_sync("resp_bigger") is not None


def test_unreadable_records_are_ignored(tmp_path: Path) -> None:
    path = tmp_path / "r.sqlite3"
    store = ResponseStore(path)
    store.put_sync(record("resp_a"))
    with sqlite3.connect(path) as connection:
        connection.execute("UPDATE responses SET state = '{\"version\": 99}'")
    assert store.get_sync("resp_a") is None


def test_conversation_dates_are_pinned(tmp_path: Path) -> None:
    state = ResponsesState(ResponseStore(tmp_path / "r.sqlite3"))
    assert state.conversation_date("thread-1", None, "2026-11-21") == "2026-11-21"
    assert state.conversation_date("thread-1", None, "2026-11-22") == "2026-11-21"  # midnight
    assert state.conversation_date("thread-2", None, "2026-11-22") == "2026-11-22"
    assert state.conversation_date(None, None, "2026-11-23") == "2026-11-23"
    assert state.conversation_date("thread-3", record("resp_a"), "2026-11-23") == "2026-11-21"
