"""Key/value-cache plans: which key/value heads keep the whole cache and which keep only sink
tokens and a recent window (StreamingLLM, DuoAttention, RazorAttention), how they are chosen from
head roles, applied to decoding, and measured."""
