"""Reference: the training model's greedy tokens on held-out prompts (for the agreement test).

    .venv-train/bin/python -m devkit.train_tiny.reference --params params.npz \
        --corpus corpus.npz --out devkit/trained/reference.npz

The prompts are the first rounds of held-out conversations (the corpus's eval split: words the
training split never used), generic ones and Codex-shaped ones (≈8k tokens). The model is the
exported parameters, experts as their MXFP4 values: exactly what the GGUF holds.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from devkit.train_tiny.model import from_params
from devkit.train_tiny.train import Corpus, reference


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=Path, required=True)
    parser.add_argument("--corpus", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--generic", type=int, default=24)
    parser.add_argument("--codex", type=int, default=4)
    parser.add_argument("--max-new", type=int, default=120)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    held = Corpus(dict(np.load(args.corpus)), "eval")
    model = from_params(str(args.params), held.keys)
    summary = reference(model, held, args.generic, args.codex, max_new=args.max_new, out=args.out)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
