"""Loading: putting the model on the machine's devices.

The GGUF header read without loading the file (gguf_header.py), the pure decision of which
layers and experts go on which GPU (placement.py), and its translation into llama.cpp's model
parameters (offload.py).
"""
