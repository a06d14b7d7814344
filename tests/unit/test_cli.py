"""The command line (server/cli.py): a list flag takes the values that follow it; a native crash
leaves the Python stack."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
from pydantic_settings import CliApp

from server.bench.options import BenchOptions
from server.cli import join_list_values, list_flags


class Parsed(BenchOptions):
    """bench's options, parsed as the command line parses them, without running the bench."""

    def cli_cmd(self) -> None:
        pass


def parsed(*args: str) -> BenchOptions:
    return CliApp.run(Parsed, cli_args=join_list_values(list(args), list_flags("bench")))


@pytest.mark.parametrize(
    "form",
    [
        ("--prompt-tokens", "512", "4096"),
        ("--prompt-tokens", "512,4096"),
        ("--prompt-tokens", "[512, 4096]"),
        ("--prompt-tokens", "512", "--prompt-tokens", "4096"),
    ],
)
def test_a_list_flag_reads_its_values_in_every_form(form: tuple[str, ...]) -> None:
    options = parsed("--model", "m.gguf", *form, "--gen-tokens", "8")
    assert options.prompt_tokens == [512, 4096]
    assert options.gen_tokens == 8


def test_values_stop_at_the_next_flag_and_negative_numbers_stay_values() -> None:
    options = parsed("--paths", "http", "inprocess", "--model", "m", "--n-gpu-layers", "-1")
    assert options.paths == ["http", "inprocess"]
    assert options.n_gpu_layers == -1
    assert options.model == "m"


def test_a_short_flag_ends_the_values_and_a_negative_number_does_not() -> None:
    flags = list_flags("bench")
    assert join_list_values(["--prompt-tokens", "512", "-h"], flags) == [
        "--prompt-tokens", "512", "-h",
    ]  # fmt: skip
    assert join_list_values(["--prompt-tokens", "-1", "7"], flags) == ["--prompt-tokens", "-1,7"]


def test_depths_and_streams_default_to_the_usual_sizes_and_empty_skips_them() -> None:
    options = parsed("--model", "m")
    assert options.depths == [0, 4096, 16384, 32768]
    assert options.streams == [1, 2, 4, 8]
    options = parsed("--model", "m", "--depths", "0", "256", "--streams", "[]")
    assert options.depths == [0, 256]
    assert options.streams == []


def test_only_the_subcommands_list_flags_are_joined() -> None:
    assert list_flags("bench") == {"--paths", "--prompt-tokens", "--depths", "--streams"}
    assert list_flags("serve") == frozenset()
    assert list_flags("no-such-command") == frozenset()
    args = ["serve", "--model", "a", "b"]
    assert join_list_values(args, list_flags("serve")) == args


CRASH = """
import os, signal, sys
from server.cli import main
try:
    main(["--help"])
except SystemExit:
    pass
print("enabled", flush=True)
os.kill(os.getpid(), signal.SIGSEGV)
"""


def test_a_native_crash_leaves_the_python_stack_on_stderr() -> None:
    """The command enables faulthandler: a SIGSEGV (as llama.cpp's load gave on the first GPU)
    is reported with the Python stack, not as a bare signal."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONFAULTHANDLER"}
    done = subprocess.run(
        [sys.executable, "-c", CRASH], env=env, capture_output=True, text=True, check=False,
        timeout=60,
    )  # fmt: skip
    assert "enabled" in done.stdout
    assert done.returncode == -signal.SIGSEGV
    assert "Fatal Python error: Segmentation fault" in done.stderr
    assert 'File "<string>", line 9' in done.stderr, done.stderr
