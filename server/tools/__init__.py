"""Tools the server runs itself inside one response (MCP servers, python, browser).

`base.py` is the protocol the generation core calls them through; each backend is a module or
package of its own beside it.
"""
