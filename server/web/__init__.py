"""The built-in chat page: static files only (static/), served by server.api.web at `/`."""
