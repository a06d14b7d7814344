"""Synthetic gpt-oss GGUF files behind `gpt-oss-server synth`: the real o200k_harmony vocabulary
and gpt-oss's architecture metadata with random weights, so llama.cpp loads, tokenizes and runs
them exactly like converted checkpoints (a smoke test of a build, a speed benchmark at the real
model's exact shapes). vocab.py writes the vocabulary, build.py the metadata and the weights."""
