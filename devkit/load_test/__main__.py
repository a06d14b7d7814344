"""`python -m devkit.load_test --model PATH [...]`: run the load test, print the JSON report."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from devkit.load_test.mix import LOOP_SHARE
from devkit.load_test.runner import LoadTestOptions, run_load_test


def parse(argv: Sequence[str] | None) -> LoadTestOptions:
    parser = argparse.ArgumentParser(prog="python -m devkit.load_test", description=__doc__)
    parser.add_argument("--model", type=Path, required=True, help="a .gguf file")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--cancel-fraction", type=float, default=0.2,
                        help="share of the streams closed mid-stream")  # fmt: skip
    parser.add_argument("--max-tokens", type=int, default=64,
                        help="output limit (each request: half of it to it)")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("load-test"),
                        help="folder for load-test.json, the server log and its store")  # fmt: skip
    parser.add_argument("--n-slots", type=int, default=4)
    parser.add_argument("--max-waiting", type=int, default=64)
    parser.add_argument("--n-ctx", type=int, default=8192)
    parser.add_argument("--n-threads", type=int, default=None)
    parser.add_argument("--rss-tolerance", type=float, default=0.05,
                        help="largest RSS growth over the run, as a fraction (soak: of the "
                        "last third's median over the first third's, after warm-up)")  # fmt: skip
    parser.add_argument("--burst", type=int, default=None,
                        help="simultaneous requests of the burst phase (default: 3 x "
                        "(n-slots + max-waiting); 0: no burst)")  # fmt: skip
    parser.add_argument("--burst-max-tokens", type=int, default=4000,
                        help="output limit of a burst request")  # fmt: skip
    parser.add_argument("--loop-share", type=float, default=LOOP_SHARE,
                        help="share of the requests that are tool loops (the tool forced until "
                        "the last round)")  # fmt: skip
    soak = parser.add_argument_group("soak mode (mixed traffic for a time instead of a count)")
    soak.add_argument("--duration-s", type=float, default=None,
                      help="run for this long; --requests is then ignored")  # fmt: skip
    soak.add_argument("--rss-every-s", type=float, default=5.0, help="RSS sampling period")
    soak.add_argument("--warmup-s", type=float, default=None,
                      help="the RSS curve's warm-up (default: a fifth of the run, at most "
                      "300 s)")  # fmt: skip
    soak.add_argument("--burst-every-s", type=float, default=300.0,
                      help="a burst phase this often (0: none)")  # fmt: skip
    args = parser.parse_args(argv)
    return LoadTestOptions(**vars(args))


def main(argv: Sequence[str] | None = None) -> int:
    options = parse(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    report, status = run_load_test(options)
    print(json.dumps(report, indent=2))
    failed = [name for name, ok in report["invariants"].items() if not ok]
    if failed:
        logging.error("invariants failed: %s", ", ".join(failed))
    return status


if __name__ == "__main__":
    sys.exit(main())
