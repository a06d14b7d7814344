"""Disk cache: the prompt cache on disk.

Saving sequences' KV state and restoring it into a sequence (prompt_cache.py), the entry files,
their format, MAC, writer thread and budget (kv_files.py). The directory they live in is
private (server/private_files.py).
"""
