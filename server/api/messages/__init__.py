"""/v1/messages: the Anthropic Messages API on the shared generation core."""
