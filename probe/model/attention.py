"""Multi-head attention: softmax(Q K^T * scale + bias) V per head, gated, concatenated, then W_O.

Two paths compute the same thing: torch's fused `scaled_dot_product_attention` (the default) and an
explicit one that materialises the weights (used when an observer asks for them). An observer sees
an `AttentionCall` (`probe.model.call`) holding the per-head q, k, v and everything needed to
rebuild the logits tile by tile, so statistics can be computed without keeping an n x n matrix.
Which keys a query sees (causal, sliding window, padding) is `probe.model.mask`'s one rule,
shared by both paths. Under a key/value plan the cache decides which keys each head sees
(`probe.model.cache`); functions attached at the named points (`probe.model.points`) read or
replace the call's arguments, DuoAttention's mixing weights, the heads' outputs and the output.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from probe.config import PE, ModelConfig, Scale
from probe.model import compensate, mask
from probe.model.cache import SiteCache, StreamRule
from probe.model.call import AttentionCall, Observer
from probe.model.layers import make_norm, sliced
from probe.model.points import Fn, at
from probe.model.positional import FIRE, ALiBi, Rotary, T5Bias
from probe.site import Site

POINTS = ("args", "mix", "heads", "out")  # see probe.model.points


class Attention(nn.Module):
    """One attention site: its projections, per-head gates and whatever acts on its scores."""

    def __init__(self, cfg: ModelConfig, site: Site) -> None:
        super().__init__()
        self.site = site
        self.d_head = cfg.d_head
        n_q, n_kv = len(site.kept_heads), len(site.kept_groups)
        qkv_bias = cfg.bias if cfg.qkv_bias is None else cfg.qkv_bias
        # a qk norm over all heads at once needs every head's q and k, removed heads' too: the
        # statistic of the heads kept depends on them (so pruning keeps those rows)
        self.whole_qk = cfg.qk_norm and cfg.qk_norm_whole
        n_q_rows, n_k_rows = (site.n_head, site.n_kv_head) if self.whole_qk else (n_q, n_kv)
        with warnings.catch_warnings():  # a fully pruned site has zero-element weights
            warnings.filterwarnings("ignore", "Initializing zero-element tensors")
            self.q = nn.Linear(cfg.d_model, n_q_rows * self.d_head, bias=qkv_bias)
            self.k = nn.Linear(cfg.d_model, n_k_rows * self.d_head, bias=qkv_bias)
            self.v = nn.Linear(cfg.d_model, n_kv * self.d_head, bias=qkv_bias)
            self.o = nn.Linear(n_q * self.d_head, cfg.d_model, bias=cfg.bias)
        # per-head gates xi: 1 keeps a head, 0 removes it exactly (Michel et al. 2019)
        self.gate = nn.Parameter(torch.ones(n_q), requires_grad=False)
        self.scale_kind = cfg.scale
        if cfg.scale == Scale.LEARNED:
            self.log_scale = nn.Parameter(torch.full((n_q,), -0.5 * math.log(self.d_head)))
        self.q_norm = self.k_norm = None
        if cfg.qk_norm:
            self.q_norm = make_norm(cfg, n_q_rows * self.d_head if self.whole_qk else self.d_head)
            self.k_norm = make_norm(cfg, n_k_rows * self.d_head if self.whole_qk else self.d_head)
        rotary = None if site.cross else cfg.rotary(site.index)
        self.rotary = None if rotary is None else Rotary(cfg, *rotary)
        self.softcap = cfg.attn_softcap
        self.scale_dim = cfg.scale_dim if cfg.scale_dim is not None else self.d_head
        score_biases = {PE.ALIBI: ALiBi, PE.T5: T5Bias, PE.FIRE: FIRE}
        self.score_bias: ALiBi | T5Bias | FIRE | None = None
        if not site.cross and cfg.pe in score_biases:
            self.score_bias = score_biases[cfg.pe](cfg, site.kept_heads)
        self.log_scale_len = cfg.log_scale_len
        self.dropout = cfg.dropout
        self._set_kv_index()
        self.observer: Observer | None = None  # set only inside Transformer.observe(...)
        self.points: dict[str, Fn] | None = None  # set only inside Transformer.intervene(...)

    def point_names(self) -> tuple[str, ...]:
        return POINTS

    def _set_kv_index(self) -> None:
        device = self.gate.device
        index = torch.tensor(self.site.kv_index(), dtype=torch.long, device=device)
        self.register_buffer("kv_index", index, persistent=False)  # [head] -> local kv head
        if self.whole_qk:  # the rows of the heads kept, in the projections of every head
            d = self.d_head
            rows = [h * d + j for h in self.site.kept_heads for j in range(d)]
            kv_rows = [g * d + j for g in self.site.kept_groups for j in range(d)]
            self.register_buffer("q_rows", torch.tensor(rows, dtype=torch.long, device=device),
                                 persistent=False)  # fmt: skip
            self.register_buffer("k_rows", torch.tensor(kv_rows, dtype=torch.long, device=device),
                                 persistent=False)  # fmt: skip

    def reset_buffers(self) -> None:
        """Recompute the buffers derived from the site (after `Transformer.empty`)."""
        self._set_kv_index()

    @property
    def layer(self) -> int:
        return self.site.index

    @property
    def kept_heads(self) -> tuple[int, ...]:
        return self.site.kept_heads

    @property
    def n_kept(self) -> int:
        """Query heads this site holds now."""
        return len(self.site.kept_heads)

    @property
    def causal(self) -> bool:
        return self.site.causal

    @torch.no_grad()
    def prune(self, kept: Sequence[int]) -> None:
        """Keep only the query heads with original ids `kept` (and the key/value heads they
        read), slicing every per-head parameter in place; original ids are kept."""
        kept = tuple(kept)
        unknown = sorted(set(kept) - set(self.site.kept_heads))
        if unknown:
            raise ValueError(f"{self.site.name} holds no heads {unknown}")
        site = self.site.without(h for h in self.site.kept_heads if h not in kept)
        local = [self.site.kept_heads.index(h) for h in site.kept_heads]
        groups = [self.site.kept_groups.index(g) for g in site.kept_groups]
        rows = [h * self.d_head + j for h in local for j in range(self.d_head)]
        kv_rows = [g * self.d_head + j for g in groups for j in range(self.d_head)]
        if not self.whole_qk:  # (a whole-head qk norm keeps every q and k row, see __init__)
            self.q = sliced(self.q, rows, 0)
            self.k = sliced(self.k, kv_rows, 0)
        self.v = sliced(self.v, kv_rows, 0)
        self.o = sliced(self.o, rows, 1)
        idx = torch.tensor(local, dtype=torch.long, device=self.gate.device)
        self.gate = nn.Parameter(self.gate.index_select(0, idx), requires_grad=False)
        if self.scale_kind == Scale.LEARNED:
            self.log_scale = nn.Parameter(self.log_scale.detach().index_select(0, idx))
        if self.score_bias is not None:
            self.score_bias.prune(local)
        self.site = site
        self._set_kv_index()

    @torch.no_grad()
    def fold_gates(self) -> None:
        """Move each gate's value into W_O's columns of its head and set the gate to 1 (a gate
        of 0 stays 0): the same function, with the scale in the weights a checkpoint keeps."""
        gate = self.gate.detach()  # [head]
        scale = torch.where(gate != 0, gate, torch.ones_like(gate)).float()
        cols = scale.repeat_interleave(self.d_head)  # [head * d_head] float32
        self.o.weight.mul_(cols.view(1, -1))  # multiplied in float32, rounded once
        self.gate.copy_(torch.where(gate != 0, torch.ones_like(gate), gate))

    def _constant_scale(self) -> float:
        return {
            Scale.SQRT: self.scale_dim**-0.5,
            Scale.INVERSE: 1.0 / self.d_head,
            Scale.NONE: 1.0,
        }[self.scale_kind]

    def head_scale(self) -> torch.Tensor:
        """[head] factor applied to q.k."""
        if self.scale_kind == Scale.LEARNED:
            return self.log_scale.exp()
        return torch.full((self.n_kept,), self._constant_scale(), device=self.gate.device)

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        return x.view(b, t, -1, self.d_head).transpose(1, 2)  # [batch, head, seq, d_head]

    def _qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # one matmul for q, k and v. (Three separate ones would skip copying the weights, which
        # decoding a token at a time feels (SmolLM2: 0.93x transformers' time instead of about
        # 1.1x), but their rounding then depends on how many heads a layer keeps, and a pruned
        # model would no longer equal the gated one bit for bit.)
        weight = torch.cat([self.q.weight, self.k.weight, self.v.weight])  # [q + 2 kv, d]
        bias = None
        if self.q.bias is not None:
            bias = torch.cat([self.q.bias, self.k.bias, self.v.bias])
        qkv = F.linear(x, weight, bias)  # [batch, seq, q + 2 kv]
        sizes = [self.q.out_features, self.k.out_features, self.v.out_features]
        q, k, v = qkv.split(sizes, dim=-1)
        if self.whole_qk:  # normed over every head, then the kept heads' rows
            q = self.q_norm(q).index_select(-1, self.q_rows)  # [batch, seq, kept * d_head]
            k = self.k_norm(k).index_select(-1, self.k_rows)  # [batch, seq, kv kept * d_head]
        return self._split(q), self._split(k), self._split(v)

    def _per_query_head(self, kv: torch.Tensor) -> torch.Tensor:
        """[batch, kv_head, seq, d_head] -> [batch, head, seq, d_head]: each query head's k or v."""
        if not self.site.grouped:
            return kv
        return kv.index_select(1, self.kv_index)

    def _length_factor(self, q_len: int, k_len: int, device: torch.device) -> torch.Tensor | None:
        """log(n_visible) / log(L_train) per query row (Chiang & Cholak 2022)."""
        if self.log_scale_len is None:
            return None
        n = mask.visible_counts(self.site, q_len, k_len, device)  # [q]
        return n.log() / math.log(self.log_scale_len)  # [q]

    def forward(
        self,
        x: torch.Tensor,
        context: torch.Tensor | None = None,
        q_pos: torch.Tensor | None = None,
        k_pos: torch.Tensor | None = None,
        key_mask: torch.Tensor | None = None,
        cache: SiteCache | None = None,
        stream: StreamRule | None = None,
    ) -> torch.Tensor:
        """x [batch, q_len, d_model]; context [batch, k_len, d_model] for cross-attention;
        q_pos [batch, q_len], k_pos [batch, k_len] integer positions; key_mask [batch, k_len]
        bool (False for padding). Returns [batch, q_len, d_model].

        With `cache` (self-attention), x holds only the new tokens: their keys and values join
        the cache, and k_pos and key_mask describe every key (cached and new). A cache with a
        key/value plan's rule decides which keys each head sees (`SiteCache.update`); `stream`
        (no cache) applies a rule as a mask over the whole sequence instead."""
        if self.points is not None:  # read only: what a function returns here is not used
            args = dict(x=x, context=context, q_pos=q_pos, k_pos=k_pos, key_mask=key_mask)
            at(self.points, "args", {**args, "cache": cache, "stream": stream})
        if context is None:  # one matmul for q, k and v
            q, k, v = self._qkv(x)  # [batch, head, seq, d_head] each
        else:
            q = self._split(self.q(x))  # [batch, head, q_len, d_head]
            k = self._split(self.k(context))  # [batch, head, k_len, d_head]
            v = self._split(self.v(context))  # [batch, head, k_len, d_head]
        b, _, q_len, _ = q.shape
        k_len = k.shape[2]
        if q_pos is None:
            q_pos = torch.arange(q_len, device=x.device).expand(b, q_len)  # [batch, q_len]
        if k_pos is None:
            k_pos = q_pos if context is None else torch.arange(k_len, device=x.device).expand(b, -1)
        if self.q_norm is not None and not self.whole_qk:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rotary is not None:  # new keys stand where the new queries do
            q, k = self.rotary(q, q_pos), self.rotary(k, k_pos if cache is None else q_pos)
        if cache is not None and cache.rule is not None:
            return self._planned(q, k, v, q_pos, k_pos, key_mask, cache)
        if cache is not None:
            k, v = cache.append(k, v)  # [batch, kv_head, cached + q_len, d_head]
            k_len = k.shape[2]
        k, v = self._per_query_head(k), self._per_query_head(v)  # [batch, head, k_len, d_head]
        scale = self.head_scale()  # [head]
        factor = self._length_factor(q_len, k_len, x.device)  # [q_len] or None
        bias = self.score_bias.bias(q_pos, k_pos) if self.score_bias is not None else None
        visible = mask.visible(self.site, q_len, k_len, key_mask, x.device)  # [b|1, 1, q, k]
        if stream is not None:  # [batch|1, head, q, k]: streaming heads see sink + window
            visible = stream.visible(self.kv_index, q_len, k_len, visible)
        observer = self.observer if self.n_kept > 0 else None  # nothing to see in a pruned site
        call = None
        if observer is not None:
            call = AttentionCall(self.site, q, k, v, scale, factor, bias, visible, self.softcap)
        out = self._observed(observer, call, v) if observer is not None else None
        if out is None and self.softcap is not None:  # no fused kernel soft-caps
            out = self._capped(q, k, v, scale, factor, bias, visible)
        if out is None:
            out = self._fused(q, k, v, scale, factor, bias, visible, key_mask, stream is None)
        if stream is not None and stream.compensate:  # RazorAttention's token
            site_rule = mask.visible(self.site, q_len, k_len, key_mask, x.device)
            out = compensate.streamed(out, q, k, v, scale, factor, site_rule, stream,
                                      self.kv_index)  # fmt: skip
        if stream is not None and self.points is not None:  # DuoAttention's mixing
            mix = at(self.points, "mix", None)  # [head] or None
            if mix is not None:  # mix * full + (1 - mix) * streaming
                out = self._mixed(mix, out, q, k, v, scale, factor, bias, key_mask)
        out = out * self.gate.to(out.dtype).view(1, -1, 1, 1)  # [batch, head, q_len, d_head]
        if call is not None:
            call.head_out = out
            observer.record(call)
        return self._project(out)  # [batch, q_len, d_model]

    def _project(self, out: torch.Tensor) -> torch.Tensor:
        """The gated head outputs [batch, head, q_len, d_head] merged and through W_O."""
        b, _, q_len, _ = out.shape
        merged = out.transpose(1, 2).reshape(b, q_len, self.n_kept * self.d_head)
        if self.points is None:
            return self.o(merged)  # [batch, q_len, d_model]
        merged = at(self.points, "heads", merged)  # [batch, q_len, n_kept * d_head]
        return at(self.points, "out", self.o(merged))  # [batch, q_len, d_model]

    def _planned(self, q, k, v, q_pos, k_pos, key_mask: torch.Tensor | None,
                 cache: SiteCache) -> torch.Tensor:  # fmt: skip
        """Attention of the new queries q [batch, head, q_len, d_head] through a cache with a
        rule; k, v [batch, kv_head, q_len, d_head] are the new tokens' (they join the cache);
        k_pos, key_mask [batch, len] cover every token so far. Each group of query heads
        attends, in its own call, to the keys the cache returns for it, so a streaming head's
        keys are never padded back to the full length (its memory really is cut)."""
        if self.observer is not None:
            raise ValueError(
                "observing a model that decodes with a key/value plan is not supported; "
                "observe the full forward with `plan=` instead"
            )
        b, _, q_len, _ = q.shape
        k_len = k_pos.shape[1]
        factor = self._length_factor(q_len, k_len, q.device)  # [q_len] or None: the site's rule
        start = k_len - q_len
        p = torch.arange(start, k_len, device=q.device)  # [q_len] the queries' arrival indices
        scale = self.head_scale()  # [head]
        out = q.new_zeros(b, q.shape[1], q_len, v.shape[-1])  # [batch, head, q_len, d_head]
        for seen in cache.update(k, v, start, self.site.kv_index()):
            idx, j = seen.heads, seen.index  # [h], [len]
            bias = None
            if self.score_bias is not None:  # at the kept keys' original positions
                bias = self.score_bias.bias(q_pos, k_pos.index_select(1, j)).index_select(1, idx)
            # a masked rule cuts at every query; an unmasked one shows the call's queries what
            # the cache held and the call's keys (the cut follows the call)
            masked = seen.rule is not None and seen.rule.masked
            keeps = seen.rule.keeps(p, j) if masked else None  # [q, len]
            visible = mask.visible_at(self.site, p, j, key_mask, keeps)  # [batch|1, 1, q, len]
            hq, hs = q.index_select(1, idx), scale.index_select(0, idx)  # [b, h, q, d], [h]
            if seen.rule is not None and seen.rule.compensate:  # RazorAttention's token
                out[:, idx] = compensate.planned(self.site, hq, seen, p, key_mask, hs, factor)
                continue
            out[:, idx] = self.attend(hq, seen.k, seen.v, hs, factor, bias, visible)
        out = out * self.gate.to(out.dtype).view(1, -1, 1, 1)  # [batch, head, q_len, d_head]
        return self._project(out)  # [batch, q_len, d_model]

    def _mixed(self, mix: torch.Tensor, streamed: torch.Tensor, q, k, v, scale, factor, bias,
               key_mask: torch.Tensor | None) -> torch.Tensor:  # fmt: skip
        """DuoAttention's training-time head output (Xiao et al. 2025): per query head, mix [head]
        * full attention + (1 - mix) * `streamed` (the streaming-masked output, [batch, head,
        q_len, d_head]); the full output computed exactly as the plain forward computes it."""
        visible = mask.visible(self.site, q.shape[2], k.shape[2], key_mask, q.device)
        if self.softcap is not None:  # visible: [batch|1, 1, q, k]
            full = self._capped(q, k, v, scale, factor, bias, visible)
        else:
            full = self._fused(q, k, v, scale, factor, bias, visible, key_mask)
        gate = mix.to(full.dtype).view(1, -1, 1, 1)  # [1, head, 1, 1]
        return gate * full + (1 - gate) * streamed  # [batch, head, q_len, d_head]

    def attend(self, q, k, v, scale, factor, bias, visible) -> torch.Tensor:
        """softmax(scores) @ v for q [batch, head, q, d], k, v [batch, head, k, d] with an
        explicit mask `visible` [batch|1, 1|head, q, k] (the fused or soft-capped path)."""
        if self.softcap is not None:
            return self._capped(q, k, v, scale, factor, bias, visible)
        return self._fused(q, k, v, scale, factor, bias, visible, None, plain_ok=False)

    def _observed(self, observer: Observer, call: AttentionCall, v: torch.Tensor):
        """The output computed from the weights when an observer has them, else None."""
        if observer.needs_weights:  # the explicit path: the observer sees the weights
            return self._explicit(call, v)
        attend = getattr(observer, "attend", None)
        if attend is None or torch.is_grad_enabled() or (self.training and self.dropout > 0):
            return None
        return attend(call)  # statistics that materialized the weights give softmax(.) @ v

    def _explicit(self, call: AttentionCall, v: torch.Tensor) -> torch.Tensor:
        """softmax(final logits) @ v with the weights materialised (kept in `call.probs`)."""
        _, logits = call.logits()  # [batch, head, q_len, k_len] float32
        probs = mask.softmax(logits, call.visible)  # [batch, head, q, k] float32
        call.probs = probs  # observers read the unrounded weights
        if self.training and self.dropout > 0:
            probs = F.dropout(probs, self.dropout)
        return probs.to(v.dtype) @ v  # [batch, head, q_len, d_head]

    def _capped(self, q, k, v, scale, factor, bias, visible) -> torch.Tensor:
        """Soft-capped attention as transformers' eager Gemma 2 computes it: the scores scaled
        and capped in the weights' dtype, the softmax in float32 (so a bf16 model rounds as
        transformers' does; observers read the float32 logits of `AttentionCall.logits`)."""
        s = q @ k.transpose(-2, -1)  # [batch, head, q_len, k_len]
        if self.scale_kind == Scale.LEARNED:
            s = s * scale.to(s.dtype).view(1, -1, 1, 1)
        else:
            s = s * self._constant_scale()
        if factor is not None:
            s = s * factor.to(s.dtype).view(1, 1, -1, 1)
        s = torch.tanh(s / self.softcap) * self.softcap
        if bias is not None:
            s = s + bias.to(s.dtype)
        if visible is not None:
            s = s.masked_fill(~visible, float("-inf"))
        probs = mask.softmax(s.float(), visible).to(v.dtype)  # [batch, head, q_len, k_len]
        if self.training and self.dropout > 0:
            probs = F.dropout(probs, self.dropout)
        return probs @ v  # [batch, head, q_len, d_head]

    def _fused(self, q, k, v, scale, factor, bias, visible, key_mask, plain_ok=True):
        """The same computation through torch's scaled_dot_product_attention (`plain_ok`
        False: `visible` is not the site's rule, so always pass it as the mask)."""
        if self.scale_kind == Scale.LEARNED or factor is not None:
            q = q * scale.to(q.dtype).view(1, -1, 1, 1)  # [batch, head, q_len, d_head]
            sdpa_scale = 1.0
        else:  # one scale for every head: let the kernel apply it
            sdpa_scale = self._constant_scale()
        if factor is not None:
            q = q * factor.to(q.dtype).view(1, 1, -1, 1)
        dropout = self.dropout if self.training else 0.0
        q_len, k_len = q.shape[2], k.shape[2]
        if plain_ok and bias is None and key_mask is None and mask.plain(self.site, q_len, k_len):
            return F.scaled_dot_product_attention(
                q, k, v, dropout_p=dropout, is_causal=self.causal, scale=sdpa_scale
            )
        attn_mask = visible
        if bias is not None:
            attn_mask = bias.to(q.dtype)
            if visible is not None:
                attn_mask = attn_mask.masked_fill(~visible, float("-inf"))
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, dropout_p=dropout, scale=sdpa_scale
        )
