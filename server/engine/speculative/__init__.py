"""Speculative decoding: exact, from a sequence's own context.

Each step, a generating sequence may put drafted tokens after its pending token in the continuous
batch, every one with its logits. The pick (apply.pick, of which a plain step is the case of an
empty draft) then picks tokens exactly as a plain step would — the TokenPicker,
with its steering, grammars, seeded sampler and test hook — at the first position, and at each
next one only while every token so far equals the draft: the logits there are those of the true
prefix. So the output is the non-speculative output, token for token for a given seed (greedy and
sampled alike); a sampled token is drawn from the target distribution at every position, and a
draft is accepted exactly when the draw equals it (probability p(draft), no bias). Forced tokens,
header choices and grammar-constrained tokens go through the same picker: a drafted token the
steering refuses is never picked, so it ends the draft, and a grammar's state only ever sees
picked tokens.

The KV cells of the rejected positions are removed (llama_memory_seq_rm on the tail); with the
full-size sliding-window cache (EngineConfig.swa_full, the default) that restores the state as if
they had never been decoded, as long as nothing else took cells of the sequence's window while its
drafts were in the cache (a batch that carries drafts fits one ubatch; plan.py); with a
window-sized cache the tail cannot be removed safely, and speculation stays off.

Pure: the n-gram drafter (ngram.py), how many tokens to draft (draft_length.py), each sequence's
drafter and the model's acceptance (drafter.py). Touching a llama.cpp context through a protocol:
the verify cost timed when the engine starts, and whether to speculate at all (verify_cost.py).
"""
