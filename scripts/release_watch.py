"""Release watch: the newest published coding-agent CLIs against this server's end-to-end tests.

For each client pinned in devkit/client_pins.py (Codex, Claude Code, pi, Cline) it asks
npm for the newest version, installs it into a scratch directory and runs that client's end-to-end
tests on it (GPT_OSS_<KEY>_VERSION / _DIR point the tests there; GPT_OSS_REQUIRE_CLIENTS=1, so a
client that cannot be installed fails rather than skips). Then it prints a table, version -> pass
or fail, and exits non-zero if any failed. A pass on a newer version means the pin can move.

    python -m scripts.release_watch                       # all clients, a fresh scratch directory
    python -m scripts.release_watch --clients codex pi --scratch /tmp/watch --keep
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from devkit.client_pins import CLIENTS, NpmClient

ROOT = Path(__file__).resolve().parents[1]
NPM_INSTALL = ("npm", "install", "--no-audit", "--no-fund", "--prefix")
# Each client's end-to-end tests (those that run the CLI itself).
TESTS = {
    "codex": ["tests/e2e/test_codex.py", "tests/e2e/test_codex_oss.py"],
    "claude-code": ["tests/e2e/test_claude_code.py"],
    "pi": ["tests/e2e/test_pi.py"],
    "cline": ["tests/e2e/test_cline.py"],
}


@dataclass
class Outcome:
    client: NpmClient
    version: str
    result: str  # pass | fail | install failed | no tests
    detail: str
    seconds: float


def newest(client: NpmClient) -> str:
    answer = subprocess.run(
        ["npm", "view", client.package, "version"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return answer.stdout.strip()


def install(client: NpmClient, version: str, scratch: Path) -> Path:
    directory = scratch / f"{client.key}-{version}"
    if not (directory / "node_modules" / ".bin" / client.binary).exists():
        subprocess.run(
            [*NPM_INSTALL, str(directory), f"{client.package}@{version}"],
            capture_output=True,
            text=True,
            timeout=900,
            check=True,
        )
    return directory


def watch(client: NpmClient, scratch: Path, pytest_args: list[str]) -> Outcome:
    started = time.monotonic()
    version = newest(client)
    tests = [t for t in TESTS.get(client.key, []) if (ROOT / t).exists()]
    if not tests:
        return Outcome(client, version, "no tests", "", 0.0)
    try:
        directory = install(client, version, scratch)
    except subprocess.CalledProcessError as exc:
        detail = (exc.stderr or "")[-300:].strip()
        return Outcome(client, version, "install failed", detail, time.monotonic() - started)
    env = {
        **os.environ,
        f"{client.env_prefix}_VERSION": version,
        f"{client.env_prefix}_DIR": str(directory),
        "GPT_OSS_REQUIRE_CLIENTS": "1",
        "PYTHONPATH": str(ROOT),
    }
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests]
    run = subprocess.run(
        [*command, *pytest_args], cwd=ROOT, env=env, capture_output=True, text=True, check=False
    )
    lines = run.stdout.strip().splitlines()
    summary = lines[-1] if lines else run.stderr[-300:]
    result = "pass" if run.returncode == 0 else "fail"
    return Outcome(client, version, result, summary, time.monotonic() - started)


def table(outcomes: list[Outcome]) -> str:
    rows = [("client", "pinned", "newest", "result", "tests", "seconds")]
    for o in outcomes:
        seconds = f"{o.seconds:.0f}"
        rows.append((o.client.package, o.client.pinned, o.version, o.result, o.detail, seconds))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [" | ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    lines.insert(1, "-|-".join("-" * w for w in widths))
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    keys = [c.key for c in CLIENTS]
    parser.add_argument("--clients", nargs="+", choices=keys, default=keys)
    parser.add_argument("--scratch", type=Path, default=None, help="install directory (kept)")
    parser.add_argument("--keep", action="store_true", help="keep a temporary scratch directory")
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments, after --")
    args = parser.parse_args()
    scratch = args.scratch or Path(tempfile.mkdtemp(prefix="gpt-oss-release-watch-"))
    scratch.mkdir(parents=True, exist_ok=True)
    outcomes = []
    try:
        for client in CLIENTS:
            if client.key in args.clients:
                outcome = watch(client, scratch, args.pytest_args)
                print(f"{client.package} {outcome.version}: {outcome.result}", flush=True)
                outcomes.append(outcome)
    finally:
        if args.scratch is None and not args.keep:
            shutil.rmtree(scratch, ignore_errors=True)
    print(table(outcomes))
    return 0 if all(o.result in ("pass", "no tests") for o in outcomes) else 1


if __name__ == "__main__":
    raise SystemExit(main())
