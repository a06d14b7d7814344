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


WITHOUT_LLAMA_CPP = """
import importlib.abc, sys
class NoLlamaCpp(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "llama_cpp" or name.startswith("llama_cpp."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, NoLlamaCpp())
import devkit, server, server.harmony.render
print("imported")
"""


def test_an_environment_without_llama_cpp_still_imports_the_packages() -> None:
    """The test model's training environment (torch, numpy, no llama.cpp) imports devkit's
    training code, hence `server`: the load-order import must not make that fail."""
    done = run_python(["-c", WITHOUT_LLAMA_CPP], timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["imported"]
