from probe.model.attention import Attention
from probe.model.call import AttentionCall, Observer
from probe.model.transformer import Transformer

__all__ = ["Attention", "AttentionCall", "Observer", "Transformer"]
