"""The python tool's kernel: the one process that lives inside the sandbox for a conversation.

This file is not imported by the server: the sandbox runs its source (`python -c`) with
whichever interpreter the operator chose, so it uses the standard library only and runs on
Python 3.8+.

It first sets its resource limits (hard and soft alike: nothing inside the sandbox can raise
them again) and copies the conversation's saved files into /mnt/data, then reads one request per
line on its request descriptor, a JSON object `{"code", "marker", "timeout"}`, and runs the code
in one namespace kept across requests, as a notebook does: statements run, the value of a last
bare expression is printed (`repr`, not when it is None), an exception prints its traceback.
Everything the code prints, its child processes too, goes to this process's stdout and stderr,
which the server reads; when a request is done the kernel kills what the code left running and
writes the request's `marker`. The marker only tells the server where to look: the code runs in
this very process and can read the request too, so the server trusts an end only once it sees
this process alone (with bubblewrap's) and blocked reading its next request, and then freezes
the sandbox until the next call (kernels.py). A call running past its `timeout` is interrupted
(TimeoutError raised in the code, the namespace kept); the server kills the whole sandbox if that
does not end it.
"""

from __future__ import annotations

import ast
import contextlib
import json
import linecache
import os
import resource
import shutil
import signal
import sys
import traceback

KERNEL_FILE = "<string>"  # the sandbox runs this source with `python -c`

LIMITS = {
    "memory_bytes": resource.RLIMIT_AS,
    "cpu_seconds": resource.RLIMIT_CPU,
    "processes": resource.RLIMIT_NPROC,
    "file_bytes": resource.RLIMIT_FSIZE,
    "open_files": resource.RLIMIT_NOFILE,
}


class ExecutionTimeout(TimeoutError):
    pass


def set_limits(limits: dict[str, int]) -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    for name, which in LIMITS.items():
        value = limits.get(name)
        if value is not None:
            resource.setrlimit(which, (int(value), int(value)))


def on_alarm(_signum: int, _frame: object) -> None:
    raise ExecutionTimeout("the code ran past the tool's time limit and was interrupted")


def run_cell(code: str, namespace: dict[str, object], cell: int) -> None:
    filename = f"<cell {cell}>"
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    try:
        tree = ast.parse(code, filename, "exec")
    except SyntaxError:
        traceback.print_exc(limit=0)
        return
    last = None
    final = tree.body[-1] if tree.body else None
    if isinstance(final, ast.Expr):
        tree.body.pop()
        last = ast.Expression(final.value)
    try:
        exec(compile(tree, filename, "exec"), namespace)
        if last is not None:
            value = eval(compile(last, filename, "eval"), namespace)
            if value is not None:
                namespace["_"] = value
                print(repr(value))
    except SystemExit as exc:
        print(f"SystemExit: {exc.code}", file=sys.stderr)
    except BaseException as exc:
        report = traceback.TracebackException.from_exception(exc)
        # the kernel's own frames are not the model's business
        report.stack = traceback.StackSummary.from_list(
            [frame for frame in report.stack if frame.filename != KERNEL_FILE]
        )
        sys.stderr.write("".join(report.format()))


def end_leftovers(kernel_pid: int) -> None:
    """A process the cell forked ends here instead of running the kernel's loop; the kernel
    kills whatever the cell left running (kill(-1) reaches only this PID namespace, and spares
    the caller and the namespace's init)."""
    if os.getpid() != kernel_pid:
        os._exit(0)
    with contextlib.suppress(OSError):  # OSError: nothing left to kill
        os.kill(-1, signal.SIGKILL)
    while True:  # the cell's children, killed or ended, are the kernel's to reap
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            break


def restore_files(saved: str, data: str) -> None:
    """The conversation's files as the server saved them after its last call."""
    if os.path.isdir(saved):
        try:
            shutil.copytree(saved, data, symlinks=True, dirs_exist_ok=True)
        except (OSError, shutil.Error) as exc:
            print(f"[some files of {data} could not be restored: {exc}]", file=sys.stderr)


def main() -> None:
    config = json.loads(sys.argv[1]) if len(sys.argv) > 1 else {}
    set_limits(config)
    restore_files(config.get("saved", ""), config.get("data", ""))
    request_fd = int(config.get("request_fd", 100))
    os.dup2(0, request_fd, inheritable=False)  # the server knows which descriptor to watch
    requests = os.fdopen(request_fd, "r", encoding="utf-8")
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # input() reads nothing instead of the server's requests
    sys.stdin = open(os.devnull, encoding="utf-8")  # noqa: SIM115
    signal.signal(signal.SIGALRM, on_alarm)
    namespace: dict[str, object] = {"__name__": "__main__", "__builtins__": __builtins__}
    out = os.fdopen(os.dup(1), "wb", buffering=0)
    kernel_pid = os.getpid()
    for cell, line in enumerate(requests, start=1):
        request = json.loads(line)
        signal.setitimer(signal.ITIMER_REAL, float(request.get("timeout", 0)))
        try:
            run_cell(request["code"], namespace, cell)
        except ExecutionTimeout as exc:  # raised between the cell's own handlers
            print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            end_leftovers(kernel_pid)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # a stream the code replaced or closed
                stream.flush()
        out.write(request["marker"].encode("ascii"))


if __name__ == "__main__":
    main()
