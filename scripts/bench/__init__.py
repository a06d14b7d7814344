"""Benchmarks beside `gpt-oss-server bench` (which lives in server/bench/): concurrency."""
