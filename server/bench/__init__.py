"""The tokens/sec benchmark (`gpt-oss-server bench`): this server, the engine alone, llama-bench
and llama-server side by side, with JSON and a chart."""
