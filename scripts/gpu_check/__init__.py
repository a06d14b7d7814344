"""The GPU check (`python -m scripts.gpu_check`) and its preparation (`.prepare`):
devkit/notes/gpu-runbook.md."""
