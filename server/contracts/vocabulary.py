"""The size of gpt-oss's token-id space (o200k_harmony, padding included): the one place it is
written. Harmony's special ids (harmony/tokens.py) end here, and the model's embedding and output
rows (engine/loading/gpt_oss.py) count it; both sides of the pipeline may read it from here."""

from __future__ import annotations

N_VOCAB = 201088
