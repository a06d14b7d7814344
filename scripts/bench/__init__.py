"""Tokens/sec benchmark: this server over HTTP, the engine in-process, and raw llama.cpp.

Every path runs the same GGUF with the same threads, context and offload settings, one after
the other in one run (never two copies of the model at once), each in a process of its own so
each path's peak memory is its own. Run it with `python -m scripts.bench --model PATH` or
`gpt-oss-server bench --model PATH`; it prints one JSON report and draws a PNG chart beside it.

Modules: plan (resolved settings and the request schedule), prompts, procs (child processes,
peak RSS), machine, sse, http_path, inprocess, llama_bin (llama-bench, llama-server), report,
chart, runner.
"""
