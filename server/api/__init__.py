"""HTTP API: OpenAI-compatible endpoints on the shared generation core."""
