"""RPC: llama.cpp's RPC backend, other hosts' devices used as if they were local.

Hosts as addresses and their reachability, pure sockets (hosts.py); registering their devices,
serving this one's, and the abort hook (backend.py); ggml's handshake in a child process
(probe.py).
"""
