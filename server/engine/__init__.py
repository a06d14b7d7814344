"""Inference engines: token ids in, token ids out. No HTTP, no harmony."""
