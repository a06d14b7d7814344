"""OpenAI's legacy Completions API (`/v1/completions`): raw prompts, echo and logprobs."""
