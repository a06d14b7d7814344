"""The mutation command's own parts that need no mutmut run: each module's mutmut table, the
outcome counts and score, the survivors list it reads, its targets' files."""

from __future__ import annotations

import tomllib
from pathlib import Path

from devkit.mutation import (
    ROOT,
    SURVIVORS,
    TARGETS,
    Result,
    Target,
    equivalent_mutants,
    mutmut_config,
    prepare,
    table,
    tally,
)

TARGET = Target("stop_strings", "server/core/stop_strings.py", ("tests/unit/core/test_x.py",))


def test_every_target_names_files_that_exist_its_unit_tests_and_no_sandbox() -> None:
    assert [t.name for t in TARGETS][:4] == ["stop_strings", "slots", "host_check", "private_files"]
    assert len({t.name for t in TARGETS}) == len(TARGETS)
    for target in TARGETS:
        assert (ROOT / target.source).is_file(), target.source
        assert all((ROOT / test).is_file() for test in target.tests), target.tests
        # a mutant runs only under unit tests (they start no engine, server or sandbox), and
        # never is the python tool's sandbox itself mutated
        assert not target.source.startswith("server/tools/python/")
        assert all(test.startswith("tests/unit/") for test in target.tests)


def test_the_working_folder_holds_the_projects_pyproject_with_the_one_module(
    tmp_path: Path,
) -> None:
    folder = prepare(TARGET, ROOT, tmp_path)
    config = tomllib.loads((folder / "pyproject.toml").read_text(encoding="utf-8"))
    mutmut = config["tool"]["mutmut"]
    assert mutmut["only_mutate"] == ["server/core/stop_strings.py"]
    assert mutmut["pytest_add_cli_args_test_selection"] == ["tests/unit/core/test_x.py"]
    assert mutmut["source_paths"] == ["server"]
    assert config["tool"]["pytest"]["ini_options"]["pythonpath"] == ["."]  # the project's own
    assert (folder / "server").resolve() == ROOT / "server"
    assert (folder / "tests" / "conftest.py").is_file()
    (folder / "mutants").mkdir()  # a run's leftovers go with the next preparation
    assert not (prepare(TARGET, ROOT, tmp_path) / "mutants").exists()
    assert mutmut_config(TARGET).startswith("\n[tool.mutmut]\n")


def test_outcomes_are_counted_and_listed_survivors_are_explained() -> None:
    outcome = {
        "m.x_f__mutmut_1": "killed",
        "m.x_f__mutmut_2": "timeout",
        "m.x_f__mutmut_3": "survived",
        "m.x_f__mutmut_4": "survived",
        "m.x_f__mutmut_5": "no tests",
        "m.x_f__mutmut_6": "caught by type check",
        "m.x_f__mutmut_7": "suspicious",
        "m.x_f__mutmut_8": "killed",
    }
    result = tally(TARGET, outcome, {"m.x_f__mutmut_3", "m.x_f__mutmut_1"})
    assert (result.mutants, result.killed, result.survived) == (8, 4, 2)
    assert (result.no_tests, result.other, result.equivalent) == (1, 1, 1)
    assert result.unexplained == ["m.x_f__mutmut_4", "m.x_f__mutmut_5", "m.x_f__mutmut_7"]
    assert result.score == 50.0
    assert Result("empty", "x.py").score == 0.0


def test_the_table_has_a_row_per_module() -> None:
    first = Result("slots", "server/engine/slots.py", mutants=10, killed=9, survived=1, seconds=3)
    lines = table([first, Result("decoder", "server/harmony/decoder.py", mutants=3)]).splitlines()
    assert lines[0].split()[:3] == ["module", "mutants", "killed"]
    assert lines[1].split() == ["slots", "10", "9", "1", "0", "0", "90.0", "%", "3", "s"]
    assert lines[2].split()[0] == "decoder"


def test_survivors_are_read_from_list_items_only() -> None:
    text = "# t\n\n- `a.xǁCǁf__mutmut_1`: same\n  * `b.x_g__mutmut_2` — why\nnot `c.x`\n"
    assert equivalent_mutants(text) == {"a.xǁCǁf__mutmut_1", "b.x_g__mutmut_2"}
    listed = equivalent_mutants(SURVIVORS.read_text(encoding="utf-8"))
    modules = {t.source.removesuffix(".py").replace("/", ".") for t in TARGETS}
    for name in listed:  # every listed mutant is of a module the command runs
        assert any(name.startswith(module + ".") for module in modules), name
