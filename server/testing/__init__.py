"""Deterministic test doubles that need no real weights: synthetic gpt-oss GGUF files (real
vocabulary and architecture, random weights) and forced-token scripts that choose what the real
engine samples. Used by the test suite, the benchmarks and `gpt-oss-server synth`."""
