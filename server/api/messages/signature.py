"""Thinking-block signatures: the exact sampled tokens of a chain of thought, authenticated.

Anthropic clients send thinking blocks back with their opaque `signature` intact. Ours is an
HMAC-SHA256 (keyed by a secret kept in the private state directory, so signatures outlive a
restart: `load_key`) over the block's text and a payload;
where the server may show the raw chain of thought, the payload is the analysis message's exact
token ids (zlib-compressed), so a block sent back replays as sampled — the KV-cache prefix
holds between tool rounds, also after the history has forgotten the message. Where the raw text
must not leave the server (summaries, omitted text under another policy), the payload is empty:
the signature only authenticates, and the history restores the tokens by the text it knows.

A signature that does not verify (forged, edited text, from another server or state directory)
restores nothing: the block is rendered from its text, never refused.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import secrets
import struct
import zlib
from collections.abc import Sequence
from pathlib import Path

from server.private_files import PrivatePathError, open_private

_CONTEXT = b"gpt-oss-server thinking signature v1\0"
_MAC_BYTES = 16
_MAX_PAYLOAD_BYTES = 16 << 20  # 4M token ids: more than any context window
KEY_FILE = "thinking-signature.key"
KEY_BYTES = 32


def load_key(path: Path) -> bytes:
    """The signing key in `path`; drawn and written there first if there is none.

    The file is this user's, 0600 (PrivatePathError otherwise, like its directory's check), and
    appears whole or not at all: written under a temporary name, then linked into place, so two
    servers starting together on one state directory end up with the same key.
    """
    try:
        with open_private(path, "rb") as file:
            key = file.read(KEY_BYTES + 1)
    except FileNotFoundError:
        key = _create_key(path)
    if len(key) != KEY_BYTES:
        raise PrivatePathError(
            f"{path} does not hold a {KEY_BYTES}-byte key: delete it and the server draws a new "
            "one (thinking blocks signed with the old one are then replayed from their text)"
        )
    return key


def _create_key(path: Path) -> bytes:
    key = secrets.token_bytes(KEY_BYTES)
    draft = path.with_name(f".{path.name}.{secrets.token_hex(8)}")
    try:
        with open_private(draft, "xb") as file:
            file.write(key)
            file.flush()
            os.fsync(file.fileno())
        try:
            os.link(draft, path)
        except FileExistsError:  # another server drew one first: theirs is the key
            with open_private(path, "rb") as file:
                return file.read(KEY_BYTES + 1)
    finally:
        draft.unlink(missing_ok=True)
    return key


class ThinkingSigner:
    """Signs thinking blocks and restores their tokens; one per server (without a key: one drawn
    for this instance only)."""

    def __init__(self, key: bytes | None = None) -> None:
        self._key = key if key is not None else secrets.token_bytes(32)

    def sign(self, text: str, tokens: Sequence[int] | None = None) -> str:
        """The signature of a block with this text; `tokens` (if given) travel inside it."""
        payload = zlib.compress(struct.pack(f"<{len(tokens)}I", *tokens)) if tokens else b""
        mac = self._mac(text, payload)
        return base64.urlsafe_b64encode(mac + payload).decode("ascii").rstrip("=")

    def verify(self, text: str, signature: str) -> bool:
        """Whether `signature` was made by this server for exactly this text."""
        return self._payload(text, signature) is not None

    def tokens(self, text: str, signature: str) -> tuple[int, ...] | None:
        """The exact tokens a valid signature carries; None if it is invalid or carries none."""
        payload = self._payload(text, signature)
        if not payload:
            return None
        try:
            raw = zlib.decompressobj().decompress(payload, _MAX_PAYLOAD_BYTES)
        except zlib.error:
            return None
        if not raw or len(raw) % 4:
            return None
        return struct.unpack(f"<{len(raw) // 4}I", raw)

    def _payload(self, text: str, signature: str) -> bytes | None:
        try:
            padded = signature + "=" * (-len(signature) % 4)
            blob = base64.urlsafe_b64decode(padded.encode("ascii"))
        except (binascii.Error, UnicodeEncodeError, ValueError):
            return None
        mac, payload = blob[:_MAC_BYTES], blob[_MAC_BYTES:]
        if len(mac) != _MAC_BYTES or not hmac.compare_digest(mac, self._mac(text, payload)):
            return None
        return payload

    def _mac(self, text: str, payload: bytes) -> bytes:
        encoded = text.encode("utf-8", "surrogatepass")
        message = b"".join((_CONTEXT, struct.pack("<Q", len(encoded)), encoded, payload))
        return hmac.new(self._key, message, hashlib.sha256).digest()[:_MAC_BYTES]
