"""`export_gguf`: an imported Llama-family model, pruned or not, as a llama.cpp GGUF file.

A model whose every layer keeps the same query and key/value head counts is written as llama.cpp's
`llama` architecture; one whose layers differ (an importance-ranked, ragged pruning) as `deci`
(the architecture of NVIDIA's Nemotron-NAS models), whose `deci.attention.head_count` and
`head_count_kv` are per-layer arrays and whose layers may have no attention at all. Tensors are
written in float32, float16 or bfloat16 (norm weights always float32, as llama.cpp's converter
does); quantizing is llama.cpp's job (`llama-quantize`).

What llama.cpp cannot say, and how the file still computes the same function:

- llama.cpp groups query heads in equal, consecutive runs per key/value head. A pruned layer
  whose groups keep different numbers of query heads (3, 2, 2) is written with every group
  filled up to the largest (3, 3, 3) by query heads that do nothing (zero query rows, zero
  output columns: they attend, and add exactly 0). The key/value heads, and so llama.cpp's
  key/value cache, stay probe's; the filler costs their q and o weights and their attention
  arithmetic (`GGUFExport.padded_heads` counts them).
- Rotary pairs: llama.cpp's llama and deci rotate adjacent rows, Hugging Face's Llama the two
  halves of a head, so q and k rows are permuted per head, as llama.cpp's converter does (the
  inverse of `gguf_archs.unpermute_rotary`).
- Per-head gates other than 1 (a masked model) are folded into the output projection.
- Rotary scaling as llama.cpp's converter writes it (`gguf_rope`): linear and yarn as metadata,
  llama3 as the tensor `rope_freqs.weight`; the kinds llama.cpp's llama cannot compute
  (dynamic, longrope, ntk) are refused.

The tokenizer is carried over from the checkpoint's tokenizer.json: byte-level BPE vocabularies
(`tokenizer.ggml.model = "gpt2"`), with the pre-tokenizer named as llama.cpp knows it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from probe.errors import ProbeError, optional
from probe.files import publish, temporary_beside
from probe.interop.gguf_rope import add_scaling
from probe.interop.gguf_rope import check_exportable as check_scaling
from probe.interop.tokenizer import _FAMILIES, _GPT2, bytes_to_unicode
from probe.model import Transformer

EXPORTABLE = ("llama",)  # model types (probe import's) written as GGUF
GGUF_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}
FILE_TYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 32}  # llama_ftype ALL_F32, ...


@dataclass(frozen=True)
class GGUFExport:
    path: Path
    arch: str  # llama or deci
    heads: tuple[int, ...]  # query heads per layer
    kv_heads: tuple[int, ...]  # key/value heads per layer, as written
    padded_heads: int  # filler query heads written to even out unequal groups, in all
    dtype: torch.dtype
    bytes: int


def layer_heads(model: Transformer) -> list[tuple[list[int | None], list[int]]]:
    """Per layer: the written query heads (local query head, or None for a filler head) and the
    written key/value heads (local ids, or None for a filler of zeros), each key/value head's
    query heads consecutive and equally many (see the module docstring). A first layer without
    heads gets one filler head: llama.cpp reads the head size off layer 0."""
    out = []
    for i, module in enumerate(model.attention_modules()):
        kv_of = module.kv_index.tolist()  # [head] -> local kv head
        if not kv_of and i == 0:  # llama.cpp sizes heads from layer 0: one head doing nothing
            out.append(([None], [None]))
            continue
        groups = sorted(set(kv_of))
        members = {g: [h for h, k in enumerate(kv_of) if k == g] for g in groups}
        width = max((len(m) for m in members.values()), default=0)
        slots = [h for g in groups for h in members[g] + [None] * (width - len(members[g]))]
        out.append((slots, groups))
    return out


def check_exportable(model: Transformer, model_type: str) -> None:
    cfg = model.cfg
    if model_type not in EXPORTABLE:
        raise ProbeError(f"GGUF export writes Llama-family models ({', '.join(EXPORTABLE)}); "
                         f"this one is {model_type}. Use --format hf.")  # fmt: skip
    if cfg.qk_norm or cfg.sliding_window is not None or cfg.qkv_bias or cfg.bias:
        raise ProbeError("GGUF export writes plain Llama layers; this model has QK-norm, a "
                         "sliding window or biases. Use --format hf.")  # fmt: skip
    if cfg.rope_fraction != 1.0:
        raise ProbeError("GGUF export writes a rotary over whole heads; this model rotates "
                         f"{cfg.rope_fraction} of each. Use --format hf.")  # fmt: skip
    check_scaling(cfg.rope_scaling, cfg.rope_base, cfg.rotary_dims)


def _permute(weight: torch.Tensor, n_head: int) -> torch.Tensor:
    """Hugging Face's rotate_half rows of each head as llama.cpp's adjacent rotary pairs."""
    rows, cols = weight.shape
    d_head = rows // n_head
    halves = weight.reshape(n_head, 2, d_head // 2, cols)  # [head, half, pair i, d_model]
    return halves.transpose(1, 2).reshape(rows, cols)  # [head * pair i * half, d_model]


def _array(tensor: torch.Tensor, dtype: torch.dtype) -> tuple[np.ndarray, object | None]:
    """A numpy array the writer takes, and the raw GGUF type for bfloat16 (numpy has none)."""
    gguf = optional("gguf", "GGUF export")

    tensor = tensor.detach().to("cpu", dtype).contiguous()
    if dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(np.uint8), gguf.GGMLQuantizationType.BF16
    return tensor.numpy(), None


def _tensors(model: Transformer, plan) -> dict[str, torch.Tensor]:
    """GGUF name -> tensor (float), written layer by layer in llama.cpp's names."""
    state = model.state_dict()
    cfg = model.cfg
    out = {"token_embd.weight": state["embed.weight"]}
    modules = model.attention_modules()
    for i, ((slots, groups), module) in enumerate(zip(plan, modules, strict=True)):
        b, d = f"blocks.{i}.", cfg.d_head
        if slots:
            q, o = state[f"{b}attn.q.weight"], state[f"{b}attn.o.weight"]
            gate = module.gate.detach().to(o.dtype)  # [head]: folded into W_O
            q_rows = [q[h * d : (h + 1) * d] if h is not None else q.new_zeros(d, q.shape[1])
                      for h in slots]  # fmt: skip
            o_cols = [o[:, h * d : (h + 1) * d] * gate[h] if h is not None
                      else o.new_zeros(o.shape[0], d) for h in slots]  # fmt: skip
            k_all, v_all = state[f"{b}attn.k.weight"], state[f"{b}attn.v.weight"]
            zeros = k_all.new_zeros(d, cfg.d_model)
            k = torch.cat([k_all[g * d : (g + 1) * d] if g is not None else zeros for g in groups])
            v = torch.cat([v_all[g * d : (g + 1) * d] if g is not None else zeros for g in groups])
            out |= {
                f"blk.{i}.attn_norm.weight": state[f"{b}ln_attn.weight"],
                f"blk.{i}.attn_q.weight": _permute(torch.cat(q_rows), len(slots)),
                f"blk.{i}.attn_k.weight": _permute(k, len(groups)),
                f"blk.{i}.attn_v.weight": v,
                f"blk.{i}.attn_output.weight": torch.cat(o_cols, dim=1),
            }  # fmt: skip
        out |= {
            f"blk.{i}.ffn_norm.weight": state[f"{b}ln_ffn.weight"],
            f"blk.{i}.ffn_gate.weight": state[f"{b}ffn.gate.weight"],
            f"blk.{i}.ffn_up.weight": state[f"{b}ffn.up.weight"],
            f"blk.{i}.ffn_down.weight": state[f"{b}ffn.down.weight"],
        }
    out["output_norm.weight"] = state["ln_final.weight"]
    if not cfg.tie_embeddings:
        out["output.weight"] = state["head.weight"]
    return out


def export_gguf(
    model: Transformer, model_type: str, tokenizer, path: Path,
    dtype: torch.dtype | None = None, name: str = "probe export",
    eos: int | None = None,
) -> GGUFExport:  # fmt: skip
    """Write `model` to the GGUF file `path` (atomically: a killed export leaves no file).
    `eos`: the end-of-text id the model's source names (`source_eos`); else it is read off the
    tokenizer (`gguf_vocab`)."""
    gguf = optional("gguf", "GGUF export")

    check_exportable(model, model_type)
    cfg = model.cfg
    dtype = dtype or next(model.parameters()).dtype
    if dtype not in GGUF_DTYPES:
        raise ProbeError(f"GGUF export writes float32, float16 or bfloat16, not {dtype}.")
    plan = layer_heads(model)
    heads = tuple(len(h) for h, _ in plan)
    kv_heads = tuple(len(g) for _, g in plan)
    ragged = len(set(heads)) > 1 or len(set(kv_heads)) > 1 or 0 in heads
    arch = "deci" if ragged else "llama"
    vocab = gguf_vocab(tokenizer, cfg.vocab_size, eos)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ProbeError(f"cannot create '{path.parent}': {exc.strerror or exc}.") from None
    with temporary_beside(path) as tmp:  # a killed export's leftover goes on the next one
        writer = gguf.GGUFWriter(tmp, arch)
        writer.add_name(name)
        writer.add_file_type(FILE_TYPES[dtype])
        writer.add_vocab_size(cfg.vocab_size)
        writer.add_context_length(cfg.max_len)
        writer.add_embedding_length(cfg.d_model)
        writer.add_block_count(cfg.n_layer)
        writer.add_feed_forward_length(cfg.d_ff)
        writer.add_head_count(list(heads) if ragged else heads[0])
        writer.add_head_count_kv(list(kv_heads) if ragged else kv_heads[0])
        writer.add_key_length(cfg.d_head)
        writer.add_value_length(cfg.d_head)
        writer.add_rope_dimension_count(cfg.d_head)
        writer.add_rope_freq_base(cfg.rope_base)
        writer.add_layer_norm_rms_eps(cfg.ln_eps)
        extra = add_scaling(writer, cfg.rope_base, cfg.d_head, cfg.rope_scaling)
        _add_vocab(writer, vocab)
        for gguf_name, array in extra.items():  # llama3's rope_freqs: float32, as the converter
            writer.add_tensor(gguf_name, array)
        for gguf_name, tensor in _tensors(model, plan).items():
            keep = torch.float32 if tensor.dim() == 1 else dtype  # norms stay float32
            array, raw = _array(tensor, keep)
            writer.add_tensor(gguf_name, array, raw_shape=tensor.shape if raw else None,
                              raw_dtype=raw)  # fmt: skip
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        publish(tmp, path)
    padded = sum(h is None for slots, _ in plan for h in slots)
    return GGUFExport(path, arch, heads, kv_heads, padded, dtype, path.stat().st_size)


# ------------------------------------------------------------------------------------ tokenizer
NORMAL, CONTROL, USER_DEFINED, UNUSED = 1, 3, 4, 5  # llama.cpp token types
# the `tokenizer.ggml.pre` names llama.cpp's loader knows, in the order one is chosen for a family
# of pre-tokenizers that split alike (`tokenizer._FAMILIES`)
LLAMA_CPP_PRE = ("gpt-2", "starcoder", "llama-bpe", "qwen2")
# end-of-text tokens by name, for a tokenizer whose source says none
EOS_NAMES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|im_end|>", "<|eot_id|>")


@dataclass(frozen=True)
class Vocab:
    tokens: list[str]
    types: list[int]
    merges: list[str]
    pre: str
    bos: int | None  # added at the start of every input (None: nothing added)
    eos: int


def _regexes(pre: dict | None) -> tuple[str, ...] | None:
    """The split regexes a tokenizer.json pre-tokenizer applies, in order (None: not byte-level
    BPE as llama.cpp knows it)."""
    if pre is None:
        return None
    parts = pre["pretokenizers"] if pre.get("type") == "Sequence" else [pre]
    regexes: list[str] = []
    for i, part in enumerate(parts):
        kind = part.get("type")
        if kind == "Split" and "Regex" in part.get("pattern", {}):
            regexes.append(part["pattern"]["Regex"])
        elif kind == "Digits" and part.get("individual_digits"):
            regexes.append(r"\p{N}")
        elif kind == "ByteLevel" and i == len(parts) - 1:
            if part.get("use_regex", True):
                regexes.append(_GPT2)
        else:
            return None
    return tuple(regexes)


def gguf_vocab(tokenizer, vocab_size: int, eos: int | None = None) -> Vocab:
    """llama.cpp's view of a byte-level BPE tokenizer (a `tokenizers.Tokenizer`). BOS is the
    special token the post-processor puts first (none: nothing is added); EOS is `eos` when
    given (the model's source says), else the special token the post-processor puts last, else
    the first special token named like an end of text (`EOS_NAMES`), else the first special
    token."""
    import json

    if tokenizer is None:
        raise ProbeError("The checkpoint has no tokenizer.json; GGUF export carries the "
                         "tokenizer over: import the model again with it.")  # fmt: skip
    doc = json.loads(tokenizer.to_str())
    model = doc.get("model", {})
    regexes = _regexes(doc.get("pre_tokenizer"))
    names = {tuple(fam.regexes): next(n for n in LLAMA_CPP_PRE if n in names)
             for fam, names in _FAMILIES.items()}  # fmt: skip
    if model.get("type") != "BPE" or regexes is None or regexes not in names:
        raise ProbeError(
            "GGUF export carries byte-level BPE tokenizers whose pre-tokenizer llama.cpp names "
            f"({', '.join(sorted(set(names.values())))}); this tokenizer is "
            f"{model.get('type', 'unknown')} with another pre-tokenizer."
        )
    by_id = {i: t for t, i in model["vocab"].items()}
    added = {t["id"]: t for t in doc.get("added_tokens", [])}
    by_id |= {i: t["content"] for i, t in added.items()}
    tokens, types = [], []
    alphabet = set(bytes_to_unicode().values())
    for i in range(vocab_size):
        token = by_id.get(i)
        if token is None:
            tokens.append(f"[PAD{i}]")
            types.append(UNUSED)
        elif i in added:
            tokens.append(token)
            types.append(CONTROL if added[i].get("special") else USER_DEFINED)
        else:
            tokens.append(token)
            types.append(NORMAL if set(token) <= alphabet else USER_DEFINED)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    ids = model["vocab"] | {t["content"]: i for i, t in added.items()}
    special = [i for i in sorted(added) if added[i].get("special")]
    bos, last = _template_ends(doc.get("post_processor"), ids)
    if eos is None:
        named = [i for n in EOS_NAMES for i in special if added[i]["content"] == n]
        eos = last if last is not None else (named or special or [None])[0]
    if eos is None:
        raise ProbeError("The tokenizer has no special token to end a text with (EOS), which "
                         "llama.cpp needs; use a tokenizer that has one.")  # fmt: skip
    return Vocab(tokens, types, merges, names[regexes], bos, eos)


def _template_ends(post: dict | None, ids: dict[str, int]) -> tuple[int | None, int | None]:
    """The ids a TemplateProcessing post-processor puts first and last, if special tokens."""
    if post is None:
        return None, None
    parts = post.get("processors", [post]) if post.get("type") == "Sequence" else [post]
    for part in parts:
        if part.get("type") == "TemplateProcessing":
            single = part.get("single", [])

            def token(piece):
                return ids.get(piece.get("SpecialToken", {}).get("id"))

            return (token(single[0]) if single else None, token(single[-1]) if single else None)
    return None, None


def source_eos(source: dict | None) -> int | None:
    """The end-of-text id the model's source file names: a GGUF file's tokenizer keys, or a
    Hugging Face folder's generation_config.json / config.json; None when it says nothing (or
    is gone)."""
    import json

    if not source or not source.get("path"):
        return None
    path = Path(source["path"])
    try:
        if source.get("format") == "gguf" and path.is_file():
            from probe.interop.tokenizer import gguf_metadata

            eos = gguf_metadata(path).get("tokenizer.ggml.eos_token_id")
            return int(eos) if eos is not None else None
        for name in ("generation_config.json", "config.json"):
            file = path / name
            if path.is_dir() and file.is_file():
                eos = json.loads(file.read_text(encoding="utf-8")).get("eos_token_id")
                eos = eos[0] if isinstance(eos, list) and eos else eos
                if isinstance(eos, int) and not isinstance(eos, bool):
                    return eos
    except (OSError, ValueError, TypeError, ProbeError):
        return None
    return None


def _add_vocab(writer, vocab: Vocab) -> None:
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(vocab.pre)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.types)
    writer.add_token_merges(vocab.merges)
    writer.add_eos_token_id(vocab.eos)
    writer.add_bos_token_id(vocab.bos if vocab.bos is not None else vocab.eos)
    writer.add_add_bos_token(vocab.bos is not None)
