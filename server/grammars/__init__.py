"""Converters from tool definitions (JSON schema, Lark, regex) to llama.cpp GBNF grammars."""
