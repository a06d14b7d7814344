"""`python -m server` runs the gpt-oss-server command."""

from server.cli import main

main()
