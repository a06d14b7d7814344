"""Train tiny: the trained tiny gpt-oss (corpus, model, training, reference, behaviour)."""
