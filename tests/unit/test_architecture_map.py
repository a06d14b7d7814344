"""ARCHITECTURE.md stays true: its module map names every module of `server/` and `devkit/`, the
import contracts it states are the ones CI checks, and the tests' layout is the one it describes.

The map is an indented tree: a line whose first word ends with `/` opens that package (inside the
nearest less-indented package); every `name.py` written on a line counts as mentioned in the
package open there. A module is on the map when its file name is mentioned in its own package.
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ARCHITECTURE = ROOT / "ARCHITECTURE.md"
PACKAGES = ("server", "devkit")
FILE = re.compile(r"(?<![/\w])([A-Za-z_][A-Za-z0-9_]*\.py)\b")  # a bare name, not a/path.py


def module_map(text: str) -> str:
    """The first fenced block after the module map's heading."""
    section = text.split("## The module map", 1)[1]
    return section.split("```", 2)[1]


def mentioned(block: str) -> set[str]:
    """Every `package/path/file.py` the map mentions (paths relative to the repository)."""
    stack: list[tuple[int, str]] = []  # (indent, package path) of the open packages
    found: set[str] = set()
    for line in block.splitlines():
        words = line.split()
        if not words:
            continue
        indent = len(line) - len(line.lstrip(" "))
        first = words[0].rstrip(",")
        if first.endswith("/"):
            while stack and stack[-1][0] >= indent:
                stack.pop()
            parent = stack[-1][1] if stack else ""
            stack.append((indent, f"{parent}{first}"))
        elif stack and FILE.fullmatch(first):
            while len(stack) > 1 and stack[-1][0] >= indent:
                stack.pop()
        package = stack[-1][1] if stack else ""
        found.update(f"{package}{name}" for name in FILE.findall(line))
    return found


def modules() -> list[str]:
    return sorted(
        path.relative_to(ROOT).as_posix()
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
        if path.name != "__init__.py"
    )


def test_parser_reads_nesting_and_descriptions() -> None:
    block = """
server/
  cli.py, app.py   wiring
  api/             HTTP
    chat/          one API (router.py, emitter.py)
    sse.py         the formatter
  engine/          llama.cpp
    base.py        types
"""
    assert mentioned(block) == {
        "server/cli.py",
        "server/app.py",
        "server/api/chat/router.py",
        "server/api/chat/emitter.py",
        "server/api/sse.py",
        "server/engine/base.py",
    }


def test_every_module_is_on_the_map() -> None:
    on_map = mentioned(module_map(ARCHITECTURE.read_text(encoding="utf-8")))
    missing = [module for module in modules() if module not in on_map]
    assert not missing, f"modules not in ARCHITECTURE.md's module map: {missing}"


def test_the_map_names_no_module_that_is_gone() -> None:
    on_map = mentioned(module_map(ARCHITECTURE.read_text(encoding="utf-8")))
    gone = sorted(path for path in on_map if not (ROOT / path).exists())
    assert not gone, f"ARCHITECTURE.md's module map names files that do not exist: {gone}"


def test_every_contract_ci_checks_is_stated_and_every_stated_one_is_checked() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    checked = {c["name"] for c in config["tool"]["importlinter"]["contracts"]}
    rules = ARCHITECTURE.read_text(encoding="utf-8").split("## The layering rules", 1)[1]
    rules = rules.split("\n## ", 1)[0]
    stated = set(re.findall(r"^\d+\. \*\*(.+?)\*\*", rules, flags=re.MULTILINE))
    assert stated == checked, (
        f"stated, not checked: {sorted(stated - checked)}; "
        f"checked, not stated: {sorted(checked - stated)}"
    )


ENGINE_MODULES = ("server.engine.llama",)  # LlamaEngine: the runtime that loads a model
ENGINE_FIXTURES = {"engine", "runtime", "client", "app"}  # the fixtures that start an engine


def test_unit_tests_start_no_engine() -> None:
    """tests/unit is pure: no unit test imports the engine's runtime or asks for a fixture that
    starts one (those tests live in tests/engine, tests/api and tests/e2e)."""
    offenders = []
    for path in sorted((ROOT / "tests" / "unit").rglob("test_*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module in ENGINE_MODULES:
                offenders.append(f"{path.name} imports {node.module}")
            elif isinstance(node, ast.Import):
                offenders += [
                    f"{path.name} imports {a.name}" for a in node.names if a.name in ENGINE_MODULES
                ]
            elif isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                asked = {a.arg for a in node.args.args} & ENGINE_FIXTURES
                offenders += [f"{path.name}::{node.name} asks for {a}" for a in sorted(asked)]
    assert not offenders, "\n".join(offenders)


def test_unit_tests_mirror_the_packages() -> None:
    """A unit test module sits in the folder of the package it tests: tests/unit/<package path>
    mirrors server/ (its sub-packages) and devkit/; at its root only tests of the whole."""
    folders = {
        p.relative_to(ROOT / "tests" / "unit").as_posix()
        for p in (ROOT / "tests" / "unit").rglob("*")
        if p.is_dir() and p.name != "__pycache__"
    }
    packages = {
        p.relative_to(ROOT / "server").as_posix()
        for p in (ROOT / "server").rglob("*")
        if p.is_dir() and "__pycache__" not in p.parts
    } | {"devkit"}
    stray = sorted(f for f in folders if f not in packages and f.split("/")[0] != "devkit")
    assert not stray, f"tests/unit folders that mirror no package: {stray}"


def imported_modules(tree: ast.AST) -> list[str]:
    """Every module an `import` or `from ... import` names (`from a import b`: a and a.b)."""
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names += [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
    return names


def test_no_test_module_imports_another() -> None:
    """Tests share through tests/support (or devkit), never through another test module or a
    conftest: a test module is not a library, and pytest loads conftests by itself."""
    offenders = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for name in sorted(set(imported_modules(ast.parse(path.read_text(encoding="utf-8"))))):
            last = name.split(".")[-1]
            if name.startswith("tests.") and (last.startswith("test_") or last == "conftest"):
                offenders.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not offenders, "\n".join(offenders)
