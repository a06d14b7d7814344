"""Split a GGUF file the way llama.cpp's gguf-split does (PREFIX-0000i-of-0000N.gguf).

The first part keeps every metadata key; each part gets split.no / split.count /
split.tensors.count and a contiguous share of the tensors, with their data copied byte for byte.
Tests use it to check that a split model (like gpt-oss-120b's three files) resolves, is measured
across its parts, and loads in llama.cpp.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from server.engine.loading.gguf_header import (  # the header layout, not re-implemented
    _read_counts,
    _skip_metadata,
)

UINT16, INT32 = 2, 5


@dataclass(frozen=True)
class _Tensor:
    name: bytes
    dims: tuple[int, ...]
    ggml_type: int
    data: bytes


def split_gguf(source: Path, directory: Path, prefix: str, n_parts: int) -> list[Path]:
    """Write `source` as n_parts files in `directory`; their paths, first part first."""
    metadata, n_kv, tensors, alignment = _read(source)
    share = -(-len(tensors) // n_parts)
    paths = []
    for index in range(n_parts):
        chunk = tensors[index * share : (index + 1) * share]
        split_kv = (
            _kv(b"split.no", UINT16, struct.pack("<H", index))
            + _kv(b"split.count", UINT16, struct.pack("<H", n_parts))
            + _kv(b"split.tensors.count", INT32, struct.pack("<i", len(tensors)))
        )
        kv, count = (metadata + split_kv, n_kv + 3) if index == 0 else (split_kv, 3)
        path = directory / f"{prefix}-{index + 1:05d}-of-{n_parts:05d}.gguf"
        path.write_bytes(_file(kv, count, chunk, alignment))
        paths.append(path)
    return paths


def _read(source: Path) -> tuple[bytes, int, list[_Tensor], int]:
    raw = source.read_bytes()
    with source.open("rb") as f:
        n_tensors, n_kv = _read_counts(f)
        kv_start = f.tell()
        alignment = _skip_metadata(f, n_kv)
        kv_end = f.tell()
        entries = [_read_entry(f) for _ in range(n_tensors)]
        data_start = _aligned(f.tell(), alignment)
    offsets = sorted(offset for *_, offset in entries)
    ends = dict(zip(offsets, [*offsets[1:], len(raw) - data_start], strict=True))
    tensors = [
        _Tensor(name, dims, ggml_type, raw[data_start + offset : data_start + ends[offset]])
        for name, dims, ggml_type, offset in entries
    ]
    return raw[kv_start:kv_end], n_kv, tensors, alignment


def _read_entry(f: IO[bytes]) -> tuple[bytes, tuple[int, ...], int, int]:
    read = f.read
    name = read(struct.unpack("<Q", read(8))[0])
    n_dims = struct.unpack("<I", read(4))[0]
    dims = struct.unpack(f"<{n_dims}Q", read(8 * n_dims))
    ggml_type, offset = struct.unpack("<IQ", read(12))
    return name, dims, ggml_type, offset


def _file(kv: bytes, n_kv: int, tensors: list[_Tensor], alignment: int) -> bytes:
    header = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), n_kv) + kv
    infos, data = b"", b""
    for tensor in tensors:
        data += b"\0" * (_aligned(len(data), alignment) - len(data))
        infos += struct.pack("<Q", len(tensor.name)) + tensor.name
        infos += struct.pack(f"<I{len(tensor.dims)}Q", len(tensor.dims), *tensor.dims)
        infos += struct.pack("<IQ", tensor.ggml_type, len(data))
        data += tensor.data
    head = header + infos
    return head + b"\0" * (_aligned(len(head), alignment) - len(head)) + data


def _kv(key: bytes, value_type: int, value: bytes) -> bytes:
    return struct.pack("<Q", len(key)) + key + struct.pack("<I", value_type) + value


def _aligned(position: int, alignment: int) -> int:
    return -(-position // alignment) * alignment
