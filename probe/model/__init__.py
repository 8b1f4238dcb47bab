from probe.model.attention import Attention, AttentionCall, Observer
from probe.model.transformer import Transformer

__all__ = ["Attention", "AttentionCall", "Observer", "Transformer"]
