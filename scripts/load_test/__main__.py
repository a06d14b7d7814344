"""`python -m scripts.load_test`: the same as `python -m server.bench.load`."""

import sys

from server.bench.load.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
