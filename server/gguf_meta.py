"""Read GGUF metadata keys without loading the file.

The gguf package's GGUFReader parses every array element into numpy objects (16 s for the
446k-merge gpt-oss vocabulary); startup needs a handful of keys, so this reads the key/value
section sequentially and stops as soon as it has what was asked for.
"""

from __future__ import annotations

import struct
from collections.abc import Collection
from pathlib import Path
from typing import IO, Any

MAGIC = b"GGUF"
_SCALARS = {
    0: "<B",
    1: "<b",
    2: "<H",
    3: "<h",
    4: "<I",
    5: "<i",
    6: "<f",
    7: "<?",
    10: "<Q",
    11: "<q",
    12: "<d",
}
_STRING, _ARRAY = 8, 9


class GGUFFormatError(ValueError):
    """The file is not a GGUF file, or its header is damaged."""


def read_metadata(path: Path, keys: Collection[str]) -> dict[str, Any]:
    """The values of `keys` found in the file's metadata (missing keys are absent)."""
    wanted = set(keys)
    found: dict[str, Any] = {}
    with path.open("rb") as f:
        n_kv = _read_header(f)
        for _ in range(n_kv):
            if not wanted:
                break
            key = _read_string(f)
            value_type = _unpack(f, "<I")
            if key in wanted:
                found[key] = _read_value(f, value_type)
                wanted.discard(key)
            else:
                _skip_value(f, value_type)
    return found


def is_gguf(path: Path) -> bool:
    with path.open("rb") as f:
        return f.read(4) == MAGIC


def _read_header(f: IO[bytes]) -> int:
    if f.read(4) != MAGIC:
        raise GGUFFormatError("not a GGUF file (bad magic)")
    version = _unpack(f, "<I")
    if version not in (2, 3):
        raise GGUFFormatError(f"unsupported GGUF version {version}")
    _unpack(f, "<Q")  # tensor count
    return int(_unpack(f, "<Q"))


def _unpack(f: IO[bytes], fmt: str) -> Any:
    size = struct.calcsize(fmt)
    data = f.read(size)
    if len(data) != size:
        raise GGUFFormatError("truncated GGUF metadata")
    return struct.unpack(fmt, data)[0]


def _read_string(f: IO[bytes]) -> str:
    length = _unpack(f, "<Q")
    data = f.read(length)
    if len(data) != length:
        raise GGUFFormatError("truncated GGUF string")
    return data.decode("utf-8", errors="replace")


def _read_value(f: IO[bytes], value_type: int) -> Any:
    if value_type in _SCALARS:
        return _unpack(f, _SCALARS[value_type])
    if value_type == _STRING:
        return _read_string(f)
    if value_type == _ARRAY:
        item_type = _unpack(f, "<I")
        count = _unpack(f, "<Q")
        return [_read_value(f, item_type) for _ in range(count)]
    raise GGUFFormatError(f"unknown GGUF value type {value_type}")


def _skip_value(f: IO[bytes], value_type: int) -> None:
    if value_type in _SCALARS:
        f.seek(struct.calcsize(_SCALARS[value_type]), 1)
    elif value_type == _STRING:
        f.seek(_unpack(f, "<Q"), 1)
    elif value_type == _ARRAY:
        item_type = _unpack(f, "<I")
        count = _unpack(f, "<Q")
        if item_type in _SCALARS:
            f.seek(count * struct.calcsize(_SCALARS[item_type]), 1)
        else:
            for _ in range(count):
                _skip_value(f, item_type)
    else:
        raise GGUFFormatError(f"unknown GGUF value type {value_type}")


def vocabulary_bytes(path: Path) -> list[bytes]:
    """Token byte strings of a byte-level BPE (`tokenizer.ggml.model` gpt2) GGUF vocabulary."""
    tokens = read_metadata(path, ["tokenizer.ggml.tokens"]).get("tokenizer.ggml.tokens")
    if not tokens:
        raise GGUFFormatError("the file has no tokenizer.ggml.tokens")
    decode = _unicode_to_byte()
    return [bytes(decode[ch] for ch in text if ch in decode) for text in tokens]


def _unicode_to_byte() -> dict[str, int]:
    """Inverse of GPT-2's byte-to-unicode table used for byte-level BPE token text."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    table = {chr(b): b for b in printable}
    extra = 0
    for b in range(256):
        if b not in printable:
            table[chr(256 + extra)] = b
            extra += 1
    return table
