"""`gpt-oss-server run`: a chat with the model in the terminal (in-process or over HTTP)."""
