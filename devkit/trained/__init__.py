"""The trained tiny gpt-oss: its committed parameters and reference runs (params.npz,
reference.npz), the GGUF assembled from them (model.py), the embedding rows of words it never
saw (rows.py), its word pool (words.py) and the Codex task its tests and measurements share
(tasks.py). Trained by devkit/train_tiny."""
