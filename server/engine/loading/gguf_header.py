"""Read GGUF metadata keys and tensor sizes without loading the file.

The gguf package's GGUFReader parses every array element into numpy objects (16 s for the
446k-merge gpt-oss vocabulary); startup needs a handful of keys and the size of each tensor, so
this reads the key/value section sequentially (skipping what it does not need) and stops as soon
as it has what was asked for.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
SPLIT_NAME = re.compile(r"(?P<prefix>.+)-(?P<index>\d{5})-of-(?P<count>\d{5})\.gguf")
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


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One tensor of a GGUF file: name, shape (ne0 first) and bytes in the file."""

    name: str
    shape: tuple[int, ...]
    n_bytes: int


def read_metadata(path: Path, keys: Collection[str]) -> dict[str, Any]:
    """The values of `keys` found in the file's metadata (missing keys are absent)."""
    wanted = set(keys)
    found: dict[str, Any] = {}
    with path.open("rb") as f:
        _, n_kv = _read_counts(f)
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


def read_tensor_infos(path: Path) -> list[TensorInfo]:
    """Every tensor of one GGUF file, in file order.

    Sizes come from the data offsets (the next tensor's offset, or the end of the file), so they
    need no table of quantization types; they include the alignment padding (< 32 bytes).
    """
    with path.open("rb") as f:
        n_tensors, n_kv = _read_counts(f)
        alignment = _skip_metadata(f, n_kv)
        entries = [_read_tensor_entry(f) for _ in range(n_tensors)]
        data_start = -(-f.tell() // alignment) * alignment
    data_size = path.stat().st_size - data_start
    offsets = sorted(offset for _, _, offset in entries)
    end_of = dict(zip(offsets, [*offsets[1:], data_size], strict=True))
    infos = []
    for name, shape, offset in entries:
        n_bytes = end_of[offset] - offset
        if n_bytes < 0:
            raise GGUFFormatError(f"tensor {name} lies outside the file (truncated download?)")
        infos.append(TensorInfo(name, shape, n_bytes))
    return infos


def split_paths(path: Path) -> list[Path]:
    """Every part of a split model given any of its parts (llama.cpp's PREFIX-0000i-of-0000N.gguf
    naming), in order; [path] for a single-file model. The parts need not exist."""
    match = SPLIT_NAME.fullmatch(path.name)
    if match is None:
        return [path]
    prefix, count = match["prefix"], int(match["count"])
    return [path.with_name(f"{prefix}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]


def _read_counts(f: IO[bytes]) -> tuple[int, int]:
    """Checks magic and version; returns (tensor count, key/value count)."""
    if f.read(4) != MAGIC:
        raise GGUFFormatError("not a GGUF file (bad magic)")
    version = _unpack(f, "<I")
    if version not in (2, 3):
        raise GGUFFormatError(f"unsupported GGUF version {version}")
    n_tensors = int(_unpack(f, "<Q"))
    return n_tensors, int(_unpack(f, "<Q"))


def _skip_metadata(f: IO[bytes], n_kv: int) -> int:
    """Moves past the key/value section; returns the file's data alignment."""
    alignment = DEFAULT_ALIGNMENT
    for _ in range(n_kv):
        key = _read_string(f)
        value_type = _unpack(f, "<I")
        if key == "general.alignment":
            alignment = int(_read_value(f, value_type))
        else:
            _skip_value(f, value_type)
    if alignment <= 0:
        raise GGUFFormatError(f"invalid general.alignment {alignment}")
    return alignment


def _read_tensor_entry(f: IO[bytes]) -> tuple[str, tuple[int, ...], int]:
    name = _read_string(f)
    n_dims = _unpack(f, "<I")
    shape = tuple(int(_unpack(f, "<Q")) for _ in range(n_dims))
    _unpack(f, "<I")  # ggml type: the size comes from the offsets
    return name, shape, int(_unpack(f, "<Q"))


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
        elif item_type == _STRING:
            _skip_strings(f, count)
        else:
            for _ in range(count):
                _skip_value(f, item_type)
    else:
        raise GGUFFormatError(f"unknown GGUF value type {value_type}")


def _skip_strings(f: IO[bytes], count: int) -> None:
    """Moves past `count` strings, walking a read-ahead buffer (a vocabulary holds ~650k)."""
    length_at = struct.Struct("<Q").unpack_from
    buf, pos = b"", 0
    for _ in range(count):
        if pos + 8 > len(buf):
            if pos > len(buf):  # the previous string ended beyond the buffer
                f.seek(pos - len(buf), 1)
                buf, pos = b"", 0
            buf, pos = buf[pos:] + f.read(1 << 20), 0
            if len(buf) < 8:
                raise GGUFFormatError("truncated GGUF string array")
        pos += 8 + length_at(buf, pos)[0]
    f.seek(pos - len(buf), 1)


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
