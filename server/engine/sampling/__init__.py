"""Sampling: choosing a token from llama.cpp's logits, exactly.

The numpy sampler (numpy_sampler.py) with its rejection draws (rejection.py) and banned-token
runs (banned.py); grammar-constrained sampling (grammar_sampler.py) over the vocabulary's prefix
tree (vocab_trie.py) and block draws (block_draws.py); llama.cpp's own sampler chain
(llama_chain.py). The engine's TokenPicker (engine/picker.py) decides which of them picks a token.
"""
