"""The o200k_harmony vocabulary's special-token ids: the one place they are written down.

Ids below `FIRST_SPECIAL` are ordinary o200k_base ranks; the harmony specials follow them up to
the end of the vocabulary (`N_VOCAB`, padding included). openai-harmony encodes the same ids;
tests check the two agree.
"""

from __future__ import annotations

from server.contracts.vocabulary import N_VOCAB

FIRST_SPECIAL = 199998  # <|startoftext|>: o200k_base has this many ordinary ranks

START_OF_TEXT = 199998  # <|startoftext|>
END_OF_TEXT = 199999  # <|endoftext|>
RETURN = 200002  # <|return|>: the final answer is complete (stop)
CONSTRAIN = 200003  # <|constrain|>: the content type of a tool call follows
CHANNEL = 200005  # <|channel|>
START = 200006  # <|start|>: a message header starts
END = 200007  # <|end|>: a message ends
MESSAGE = 200008  # <|message|>: the header is complete, content follows
CALL = 200012  # <|call|>: a tool call is complete (stop)
END_OF_PROMPT = 200018  # <|endofprompt|>: the last named special; reserved ones between

NAMES = {
    START_OF_TEXT: "<|startoftext|>",
    END_OF_TEXT: "<|endoftext|>",
    RETURN: "<|return|>",
    CONSTRAIN: "<|constrain|>",
    CHANNEL: "<|channel|>",
    START: "<|start|>",
    END: "<|end|>",
    MESSAGE: "<|message|>",
    CALL: "<|call|>",
    END_OF_PROMPT: "<|endofprompt|>",
}
SPECIALS = frozenset(range(FIRST_SPECIAL, N_VOCAB))
MESSAGE_TERMINATORS = frozenset({END, CALL, RETURN})
