"""The GPU check (`python -m scripts.gpu_check`) and its preparation (`.prepare`): docs/gpu.md."""
