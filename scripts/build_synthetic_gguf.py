"""`python -m scripts.build_synthetic_gguf --preset tiny|20b --out PATH`.

The builder is server/testing/synthetic_gguf.py (also `gpt-oss-server synth`).
"""

import sys

from server.testing.synthetic_gguf import main

if __name__ == "__main__":
    sys.exit(main())
