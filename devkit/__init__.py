"""What developers run and the product does not ship: the test models and their build cache
(models.py), forced-token scripts (forced.py), the trained tiny model (trained/), the real
agent clients run headless and captured (codex_cli.py, claude_capture.py), the load/soak tester
(load_test/) and the serving helpers tests and scripts share (serving.py). Imports `server`;
`server` never imports it."""

import server  # noqa: F401  (first: llama.cpp's libraries load before gguf's numpy; server/__init__.py)
