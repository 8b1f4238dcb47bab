"""A random-weight Llama-shaped Hugging Face checkpoint written with safetensors directly, shard
by shard (no transformers model is built), for tests and benchmarks of memory at scale. Never
committed: written into a temporary folder."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}


def llama_shapes(d_model: int, n_layer: int, n_head: int, n_kv_head: int, d_ff: int,
                 vocab: int, tied: bool = False) -> dict[str, tuple[int, ...]]:  # fmt: skip
    """Hugging Face tensor name -> shape, in the order a Llama holds them."""
    d_head = d_model // n_head
    shapes = {"model.embed_tokens.weight": (vocab, d_model)}
    for i in range(n_layer):
        h = f"model.layers.{i}."
        shapes |= {
            f"{h}input_layernorm.weight": (d_model,),
            f"{h}self_attn.q_proj.weight": (n_head * d_head, d_model),
            f"{h}self_attn.k_proj.weight": (n_kv_head * d_head, d_model),
            f"{h}self_attn.v_proj.weight": (n_kv_head * d_head, d_model),
            f"{h}self_attn.o_proj.weight": (d_model, n_head * d_head),
            f"{h}post_attention_layernorm.weight": (d_model,),
            f"{h}mlp.gate_proj.weight": (d_ff, d_model),
            f"{h}mlp.up_proj.weight": (d_ff, d_model),
            f"{h}mlp.down_proj.weight": (d_model, d_ff),
        }
    shapes["model.norm.weight"] = (d_model,)
    if not tied:
        shapes["lm_head.weight"] = (vocab, d_model)
    return shapes


def write_random_llama(folder: Path, *, d_model: int = 1024, n_layer: int = 16, n_head: int = 16,
                       n_kv_head: int = 4, d_ff: int = 2816, vocab: int = 32000,
                       dtype: torch.dtype = torch.bfloat16, shard_bytes: int = 200_000_000,
                       seed: int = 0) -> int:  # fmt: skip
    """Write the checkpoint into `folder` (config.json, model-0000K-of-0000N.safetensors and
    model.safetensors.index.json); returns the bytes its weights take."""
    folder.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    shapes = llama_shapes(d_model, n_layer, n_head, n_kv_head, d_ff, vocab)
    groups, size = [[]], 0
    for name, shape in shapes.items():
        nbytes = torch.Size(shape).numel() * dtype.itemsize
        if groups[-1] and size + nbytes > shard_bytes:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += nbytes
    weight_map, total = {}, 0
    for k, names in enumerate(groups, 1):
        file = f"model-{k:05d}-of-{len(groups):05d}.safetensors"
        tensors = {}
        for name in names:
            if name.endswith("norm.weight"):
                tensor = 1 + 0.1 * torch.randn(shapes[name], generator=generator)
            else:
                tensor = 0.02 * torch.randn(shapes[name], generator=generator)
            tensors[name] = tensor.to(dtype)
            total += tensors[name].nbytes
            weight_map[name] = file
        save_file(tensors, str(folder / file), metadata={"format": "pt"})
        del tensors
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    config = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": vocab,
        "hidden_size": d_model,
        "intermediate_size": d_ff,
        "num_hidden_layers": n_layer,
        "num_attention_heads": n_head,
        "num_key_value_heads": n_kv_head,
        "hidden_act": "silu",
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "torch_dtype": DTYPE_NAMES[dtype],
    }
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return total
