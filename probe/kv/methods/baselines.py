"""The baselines that pick no heads: `streaming` (every head keeps sink + window: StreamingLLM)
and `full` (every head keeps the whole cache)."""

from __future__ import annotations

from probe.kv.methods import KVMethod

DECLARES = (KVMethod("streaming", 50, "no full heads", fixed_share=0.0),
            KVMethod("full", 60, "every head full", fixed_share=1.0))  # fmt: skip
