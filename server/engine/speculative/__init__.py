"""Speculative decoding's pure parts: drafts from a sequence's own tokens, and how many to draft.

The n-gram drafter (ngram.py) proposes what followed the last few tokens the last time they
occurred; the draft length (draft_length.py) weighs a sequence's recent acceptance against the
verify cost measured for the loaded model. The engine's speculation.py verifies drafts in the
continuous batch; nothing here touches llama.cpp.
"""
