"""llama.cpp's libraries load before any other native library that brings libstdc++ (numpy,
gguf's numpy). A llama.cpp built with its own static libstdc++ (the first GPU machine's
compiler did so) crashed in its vocabulary load whenever the shared libstdc++ had come first
(docs/gpu.md, "The load-order crash"). The package's first import fixes the order; this test
reads the dynamic linker's own list, which is in load order."""

from __future__ import annotations

import json
import sys

import pytest

from tests.support.repo_python import run_python

LINK_MAP = """
import ctypes, json, sys
import {module}
class LinkMap(ctypes.Structure):
    pass
LinkMap._fields_ = [("l_addr", ctypes.c_void_p), ("l_name", ctypes.c_char_p),
                    ("l_ld", ctypes.c_void_p), ("l_next", ctypes.POINTER(LinkMap)),
                    ("l_prev", ctypes.POINTER(LinkMap))]
libc = ctypes.CDLL(None)
head = ctypes.POINTER(LinkMap)()
assert libc.dlinfo(ctypes.c_void_p(libc._handle), 2, ctypes.byref(head)) == 0  # RTLD_DI_LINKMAP
names = []
while head:
    names.append((head.contents.l_name or b"").decode())
    head = head.contents.l_next
print(json.dumps(names))
"""

ENTRIES = ["server", "server.cli", "devkit.models", "scripts.bench.speculative"]


def loaded_in_order(module: str) -> list[str]:
    done = run_python(["-c", LINK_MAP.format(module=module)], timeout=120)
    assert done.returncode == 0, done.stderr
    return [name.rsplit("/", 1)[-1] for name in json.loads(done.stdout.splitlines()[-1])]


def first(names: list[str], prefix: str) -> int:
    return next(i for i, name in enumerate(names) if name.startswith(prefix))


LINUX = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's link map")


@LINUX
@pytest.mark.parametrize("module", ENTRIES)
def test_llama_cpp_loads_before_numpy_and_libstdcxx(module: str) -> None:
    names = loaded_in_order(module)
    llama = first(names, "libllama")
    numpy = first(names, "_multiarray_umath")
    stdcxx = first(names, "libstdc++.so")
    assert llama < numpy, names
    assert llama < stdcxx, names  # a shared-libstdc++ build loads it as libllama's dependency


@LINUX
def test_the_check_sees_the_wrong_order() -> None:
    """The same reading, with numpy imported first, puts numpy's libraries first: the test
    above can fail."""
    names = loaded_in_order("numpy, server")
    assert first(names, "_multiarray_umath") < first(names, "libllama")
