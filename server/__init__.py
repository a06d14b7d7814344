"""gpt-oss-server: a local OpenAI-compatible server for OpenAI's gpt-oss models."""

__version__ = "0.1.0"
