"""Mutation testing of the modules that decide correctness, each against its fast tests only.

`python -m devkit.mutation [--module NAME ...] [--json PATH]` runs mutmut (the `mutation` extra,
one pinned version) on each module in its own working folder, `mutants/<NAME>/` (git-ignored):
the project's pyproject.toml with a `[tool.mutmut]` table naming the one file to mutate and its
test files, and links to server/, tests/, devkit/ and models/. mutmut copies them once more
into `mutants/<NAME>/mutants/` and runs the tests against each mutant there, one worker at a
time at the lowest CPU priority. Out: a table per module (mutants, killed, survived, never run
by a test, score) and the same as JSON.

A surviving mutant is a gap in the tests or a change that alters nothing: the second kind is
listed, with the reason, in devkit/mutation_survivors.md; a survivor not listed there is
`unexplained` and makes the command exit 1.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORK = ROOT / "mutants"  # git-ignored
SURVIVORS = Path(__file__).with_name("mutation_survivors.md")
LINKED = ("server", "tests", "devkit", "models")  # what the tests import or read


@dataclass(frozen=True)
class Target:
    """One module and the fast tests that decide whether a change to it is caught."""

    name: str
    source: str
    tests: tuple[str, ...]


TARGETS = (
    Target(
        "stop_strings", "server/core/stop_strings.py", ("tests/unit/core/test_stop_strings.py",)
    ),
    Target("slots", "server/engine/slots.py", ("tests/unit/engine/test_slots.py",)),
    Target("host_check", "server/api/host_check.py", ("tests/unit/api/test_host_check.py",)),
    Target("private_files", "server/private_files.py", ("tests/unit/test_private_files.py",)),
    Target("decoder", "server/harmony/decoder.py", ("tests/unit/harmony/test_decoder.py",)),
    Target("steering", "server/harmony/steering.py", ("tests/unit/harmony/test_steering.py",)),
    Target("plan", "server/engine/plan.py", ("tests/unit/engine/test_plan.py",)),
    Target("apply", "server/engine/apply.py", ("tests/unit/engine/test_apply.py",)),
    Target(
        "json_schema",
        "server/grammars/json_schema.py",
        ("tests/unit/grammars/test_json_schema.py",),
    ),
    Target("lark", "server/grammars/lark.py", ("tests/unit/grammars/test_lark.py",)),
    Target("regex", "server/grammars/regex.py", ("tests/unit/grammars/test_regex.py",)),
    Target(
        "address_rule",
        "server/tools/browser/addresses.py",
        ("tests/unit/tools/browser/test_addresses.py",),
    ),
)

KILLED = frozenset({"killed", "timeout", "caught by type check"})
SURVIVED = "survived"
NO_TESTS = "no tests"


@dataclass
class Result:
    """One module's mutants by outcome; `unexplained` survivors are not in the survivors list."""

    module: str
    source: str
    mutants: int = 0
    killed: int = 0
    survived: int = 0
    no_tests: int = 0
    other: int = 0  # not checked, suspicious, segfault: the run went wrong
    equivalent: int = 0  # survivors listed in mutation_survivors.md
    seconds: float = 0.0
    unexplained: list[str] = field(default_factory=list)

    @property
    def score(self) -> float:
        """Killed mutants as a share of all, in percent."""
        return 100.0 * self.killed / self.mutants if self.mutants else 0.0


def mutmut_config(target: Target) -> str:
    """The `[tool.mutmut]` table of one module's run."""
    table = {
        "source_paths": ["server"],
        "only_mutate": [target.source],
        "also_copy": [name for name in LINKED if name != "server"],
        "pytest_add_cli_args_test_selection": list(target.tests),
        "pytest_add_cli_args": ["-p", "no:cacheprovider"],
    }
    lines = [f"{key} = {json.dumps(value)}" for key, value in table.items()]
    return "\n[tool.mutmut]\n" + "\n".join(lines) + "\n"


def prepare(target: Target, root: Path, work: Path) -> Path:
    """A fresh working folder for `target`: pyproject.toml with its table, links to the rest."""
    folder = work / target.name
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    pyproject = (root / "pyproject.toml").read_text(encoding="utf-8")
    (folder / "pyproject.toml").write_text(pyproject + mutmut_config(target), encoding="utf-8")
    for name in LINKED:
        (folder / name).symlink_to(root / name, target_is_directory=True)
    return folder


def statuses(folder: Path, target: Target) -> dict[str, str]:
    """Each mutant's outcome, from the meta file mutmut writes beside the mutated copy."""
    from mutmut.stats import status_by_exit_code

    meta = json.loads((folder / "mutants" / f"{target.source}.meta").read_text(encoding="utf-8"))
    codes: Mapping[str, int | None] = meta["exit_code_by_key"]
    return {name: status_by_exit_code[code] for name, code in codes.items()}


def equivalent_mutants(text: str) -> set[str]:
    """The mutant names the survivors list argues equivalent: a list item's first `code`."""
    return set(re.findall(r"^\s*[-*] `([^`]+)`", text, flags=re.MULTILINE))


def tally(target: Target, outcome: Mapping[str, str], equivalent: Iterable[str]) -> Result:
    """Counts of one module's outcomes; survivors and untested mutants not listed equivalent
    are `unexplained`."""
    listed = set(equivalent)
    result = Result(target.name, target.source, mutants=len(outcome))
    for name, status in sorted(outcome.items()):
        if status in KILLED:
            result.killed += 1
            continue
        if status == SURVIVED:
            result.survived += 1
        elif status == NO_TESTS:
            result.no_tests += 1
        else:
            result.other += 1
        if name in listed:
            result.equivalent += 1
        else:
            result.unexplained.append(name)
    return result


# run in a module's working folder (mutmut reads its configuration from there): each mutant's
# diff, as `mutmut show` prints it, in one process instead of one per mutant
_DIFFS = """
import json, sys
from mutmut.mutation.diff_apply import find_mutant, get_diff_for_mutant
names = json.loads(sys.argv[1])
diffs = {name: get_diff_for_mutant(name, path=find_mutant(name).path) for name in names}
with open(sys.argv[2], "w", encoding="utf-8") as out:
    json.dump(diffs, out)
"""


def diffs(folder: Path, mutants: Sequence[str]) -> dict[str, str]:
    """The change each of `mutants` makes."""
    if not mutants:
        return {}
    out = folder / "diffs.json"
    command = [sys.executable, "-c", _DIFFS, json.dumps(list(mutants)), str(out)]
    subprocess.run(command, cwd=folder, capture_output=True, check=True)
    found: dict[str, str] = json.loads(out.read_text(encoding="utf-8"))
    return found


def run(target: Target, root: Path, work: Path, equivalent: Iterable[str]) -> Result:
    """Mutation-test one module: nice 19, one worker; its log in mutants/<NAME>/run.log."""
    folder = prepare(target, root, work)
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    command = ["nice", "-n", "19", sys.executable, "-m", "mutmut", "run", "--max-children", "1"]
    started = time.monotonic()
    with open(folder / "run.log", "w", encoding="utf-8") as log:
        done = subprocess.run(
            command, cwd=folder, stdout=log, stderr=subprocess.STDOUT, env=env, check=False
        )
    seconds = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"mutmut failed on {target.source}: see {folder / 'run.log'}")
    result = tally(target, statuses(folder, target), equivalent)
    result.seconds = round(seconds, 1)
    return result


def table(results: Sequence[Result]) -> str:
    """The per-module table."""
    head = ("module", "mutants", "killed", "survived", "no tests", "equivalent", "score", "time")
    rows = [
        (
            r.module,
            str(r.mutants),
            str(r.killed),
            str(r.survived),
            str(r.no_tests),
            str(r.equivalent),
            f"{r.score:.1f} %",
            f"{r.seconds:.0f} s",
        )
        for r in results
    ]
    widths = [max(len(row[i]) for row in (head, *rows)) for i in range(len(head))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True))
        for row in (head, *rows)
    ]
    return "\n".join(line.rstrip() for line in lines)


def report(results: Sequence[Result], diffs: Mapping[str, str]) -> dict[str, object]:
    """The JSON report: each module's counts, score and unexplained mutants with their diffs."""
    modules = []
    for r in results:
        entry = asdict(r)
        entry["score"] = round(r.score, 1)
        entry["unexplained"] = [{"mutant": m, "diff": diffs.get(m, "")} for m in r.unexplained]
        modules.append(entry)
    return {"mutmut": _mutmut_version(), "modules": modules}


def _mutmut_version() -> str:
    from importlib.metadata import version

    return version("mutmut")


def main(argv: Sequence[str] | None = None) -> int:
    names = [t.name for t in TARGETS]
    parser = argparse.ArgumentParser(prog="python -m devkit.mutation", description=__doc__)
    parser.add_argument(
        "--module", action="append", choices=names, help="run this one (repeatable); all if none"
    )
    parser.add_argument("--json", type=Path, help="write the JSON report here, not to stdout")
    args = parser.parse_args(argv)
    chosen = [t for t in TARGETS if not args.module or t.name in args.module]
    equivalent = equivalent_mutants(SURVIVORS.read_text(encoding="utf-8"))
    results = []
    changes: dict[str, str] = {}
    for target in chosen:
        print(f"{target.name}: {target.source} against {', '.join(target.tests)}", flush=True)
        result = run(target, ROOT, WORK, equivalent)
        changes.update(diffs(WORK / target.name, result.unexplained))
        results.append(result)
        print(table([result]).splitlines()[1], flush=True)
    print(table(results))
    text = json.dumps(report(results, changes), indent=2, ensure_ascii=False)
    if args.json:
        args.json.write_text(text + "\n", encoding="utf-8")
    else:
        print(text)
    return 1 if any(r.unexplained for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
