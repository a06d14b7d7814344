"""Harmony format: loading the encoding, rendering prompts, decoding sampled tokens."""
