"""/v1/responses: the Responses API (what Codex CLI speaks) on the shared generation core."""
