"""The data the layers hand each other: the request (transcript), the output (events), steering
directives and typed errors. Imports nothing else of the server."""
