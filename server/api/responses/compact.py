"""POST /v1/responses/compact's pure parts: what the model is asked, what the client gets back.

Compaction is done by the model itself. The conversation (the request's input after the earlier
response it continues, rendered as /v1/responses would render it, tools included) is followed
by one more user message asking for a summary that work can continue from; the answer (tools
off, reasoning not shown) is the summary. The compacted list keeps every user message verbatim,
in order, and replaces everything else (assistant messages, reasoning, tool calls and their
results, earlier summaries) with one `compaction` item after them, as OpenAI's endpoint does.

A `compaction` item sent back as input reads to the model as a developer message that carries
the summary. Its `encrypted_content` is the summary encoded (versioned, base64url), not
encrypted: this server keeps no secret from the client that sent the conversation; the field
is opaque by contract, and one this server did not make is a 400.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
from collections.abc import Sequence

from server.api.response_fields import new_id
from server.api.responses.schemas import (
    CompactionItem,
    InputTextPart,
    UserMessageItem,
)
from server.contracts.errors import InvalidRequest
from server.contracts.transcript import DeveloperMessage, Item, Transcript, UserMessage

CONTENT_PREFIX = "gpt-oss-server.compaction.v1:"
SUMMARY_REQUEST = (
    "Compact this conversation: write a summary of it that lets the work continue from the "
    "summary alone, because everything but the user's messages will be replaced by it. Keep "
    "the user's goal, decisions made, facts and results found (file names, commands, values, "
    "errors), what is done and what is left to do. Answer with the summary only."
)
SUMMARY_HEADER = (
    "The conversation before this point was compacted: the assistant's messages, reasoning and "
    "tool calls were replaced by this summary, written by the assistant at that point.\n\n"
)


def summary_transcript(transcript: Transcript) -> Transcript:
    """The transcript whose answer is the summary: the conversation as the model sees it (the
    same prefix: its cached tokens are reused), then the request for the summary."""
    items = (*transcript.items, UserMessage(SUMMARY_REQUEST))
    return dataclasses.replace(transcript, items=items, response_format=None)


def compacted(conversation: Sequence[Item], summary: str) -> list[UserMessageItem | CompactionItem]:
    """The compacted item list: the user messages, then the compaction item."""
    kept: list[UserMessageItem | CompactionItem] = [
        UserMessageItem(id=new_id("msg_"), content=[InputTextPart(text=item.text)])
        for item in conversation
        if isinstance(item, UserMessage)
    ]
    kept.append(CompactionItem(id=new_id("cmp_"), encrypted_content=encode(summary)))
    return kept


def encode(summary: str) -> str:
    return CONTENT_PREFIX + base64.urlsafe_b64encode(summary.encode("utf-8")).decode("ascii")


def decode(content: str, param: str) -> str:
    """The summary a compaction item carries; a 400 for one this server did not make."""
    if content.startswith(CONTENT_PREFIX):
        try:
            raw = base64.urlsafe_b64decode(content.removeprefix(CONTENT_PREFIX).encode("ascii"))
            return raw.decode("utf-8")
        except (binascii.Error, UnicodeError, ValueError):
            pass
    raise InvalidRequest(
        "this compaction item was not made by this server's /v1/responses/compact: its "
        "encrypted_content cannot be read here",
        param=f"{param}.encrypted_content",
        code="invalid_value",
    )


def summary_message(content: str, param: str) -> DeveloperMessage:
    """A compaction item as the model reads it."""
    return DeveloperMessage(SUMMARY_HEADER + decode(content, param))
