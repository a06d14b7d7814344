"""/v1/chat/completions with the OpenRouter reasoning convention."""
