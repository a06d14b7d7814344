"""Load test: a mixed stream of requests against `gpt-oss-server serve`, with invariants.

`python -m devkit.load_test --model PATH` starts the server as a child process on a free port,
warms it up, then sends `--requests` requests at `--concurrency`: chat completions and responses,
streaming and not (seeded shares), some with tools, a fraction of the streams closed mid-stream.
It checks that nothing answered 5xx, that every stream it did not cancel ended with its terminal
event, that every request is accounted for (client side and in /metrics), that the queue stayed
within `--max-waiting`, that the engine is idle afterwards, that the server's RSS did not grow and
that it exits cleanly on SIGTERM. It writes a JSON report and exits with 1 if an invariant fails.

Modules: mix (the seeded request plan and bodies), client (one request, its outcome), runner
(server, warm-up, run, /metrics, report).
"""
