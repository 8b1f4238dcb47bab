"""Tiny random transformers models of the families added since issue 24, saved with a word-level
tokenizer: shared by the studies and the CLI walk over every family (each family's own parity,
pruning and export tests build their own)."""

from __future__ import annotations

from pathlib import Path

import torch

VOCAB = 99
SHAPE = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
             intermediate_size=64)  # fmt: skip


def tiny_config(kind: str):
    import transformers as tf

    if kind == "qwen3":
        return tf.Qwen3Config(**SHAPE, num_key_value_heads=2, head_dim=16)
    if kind == "gemma":
        return tf.GemmaConfig(**SHAPE, num_key_value_heads=1, head_dim=16)
    if kind == "gemma2":
        return tf.Gemma2Config(**SHAPE, num_key_value_heads=2, head_dim=8, sliding_window=6,
                               query_pre_attn_scalar=16)  # fmt: skip
    if kind == "gemma3_text":
        return tf.Gemma3TextConfig(**SHAPE, num_key_value_heads=2, head_dim=8, sliding_window=6,
                                   layer_types=["sliding_attention", "full_attention"])  # fmt: skip
    if kind == "phi3":
        return tf.Phi3Config(**SHAPE, num_key_value_heads=2, pad_token_id=0, bos_token_id=1,
                             eos_token_id=2)  # fmt: skip
    if kind == "olmo2":
        return tf.Olmo2Config(**SHAPE, num_key_value_heads=2)
    if kind == "gpt_neox":
        return tf.GPTNeoXConfig(**SHAPE, rotary_pct=0.5, bos_token_id=1, eos_token_id=2)
    if kind == "smollm3":  # layer 1 without rotary
        return tf.SmolLM3Config(**SHAPE, num_key_value_heads=2, no_rope_layer_interval=2,
                                pad_token_id=0, bos_token_id=1, eos_token_id=2)  # fmt: skip
    if kind == "olmo3":  # a window of 6 keys on layer 0; YaRN on the full layer, context 8
        yarn = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8,
                "rope_theta": 10000.0}  # fmt: skip
        return tf.Olmo3Config(**SHAPE, num_key_value_heads=2, sliding_window=6,
                              layer_types=["sliding_attention", "full_attention"],
                              max_position_embeddings=32, pad_token_id=0, bos_token_id=1,
                              eos_token_id=2, rope_parameters={"full_attention": yarn,
                              "sliding_attention": {"rope_type": "default",
                                                    "rope_theta": 10000.0}})  # fmt: skip
    raise ValueError(kind)


FAMILIES = ("qwen3", "gemma", "gemma2", "gemma3_text", "phi3", "olmo2", "gpt_neox", "smollm3",
            "olmo3")  # fmt: skip


def save_tiny(kind: str, root: Path) -> Path:
    """The model of family `kind` with norms and biases moved off 1 and 0, in root / kind."""
    import transformers as tf
    from test_cli_imported import word_tokenizer

    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(tiny_config(kind)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias") or "norm" in name.lower():
                p.add_(0.1 * torch.randn_like(p))
    path = root / kind
    model.save_pretrained(path)
    word_tokenizer(False).save(str(path / "tokenizer.json"))
    return path
