"""The Transformer: decoder (GPT), encoder (BERT) or encoder-decoder (the paper), one config."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from probe.config import FFN, Arch, ModelConfig, Norm
from probe.errors import ProbeError
from probe.model.attention import Attention
from probe.model.cache import KVCache, SiteCache, StreamRule, check_right_padded, plan_rules
from probe.model.call import Observer
from probe.model.layers import FeedForward, activation, make_norm
from probe.model.points import Fn, Intervention, at
from probe.model.positional import InputPositions
from probe.site import Site


class Block(nn.Module):
    """Self-attention, optional cross-attention, optional FFN; each a residual sub-layer whose
    norms sit as `cfg.norm` says: post (x = LN(x + f(x))), pre (x = x + f(LN(x))), sandwich
    (x = x + LN'(f(LN(x)))) or branch (x = x + LN(f(x))). With `parallel_residual` attention and
    FFN read the same x: x = x + attn(LN1(x)) + ffn(LN2(x))."""

    def __init__(self, cfg: ModelConfig, sites: list[Site]) -> None:
        super().__init__()
        self.placement = cfg.norm
        self.parallel = cfg.parallel_residual
        self.attn = Attention(cfg, sites[0])
        self.ln_attn, self.ln_attn_out = self._norms(cfg)
        self.cross = None
        if len(sites) > 1:
            self.cross = Attention(cfg, sites[1])
            self.ln_cross, self.ln_cross_out = self._norms(cfg)
        self.ffn = FeedForward(cfg) if cfg.ffn != FFN.NONE else None
        if self.ffn is not None:
            self.ln_ffn, self.ln_ffn_out = self._norms(cfg)
        self.drop = nn.Dropout(cfg.dropout)
        self.points: dict[str, Fn] | None = None  # set only inside Transformer.intervene(...)

    def point_names(self) -> tuple[str, ...]:
        """The points a block calls (`probe.model.points`): its attention sub-layers' residual
        stream and update, and its output."""
        subs = ("attn", "cross") if self.cross is not None else ("attn",)
        return (*(f"{s}.{p}" for s in subs for p in ("resid_pre", "update")), "resid_post")

    @staticmethod
    def _norms(cfg: ModelConfig) -> tuple[nn.Module | None, nn.Module | None]:
        """(the norm of the input (pre, sandwich) or of the sum (post), the norm on the branch's
        output (sandwich, branch)); None where the placement has none."""
        first = make_norm(cfg) if cfg.norm != Norm.BRANCH else None
        out = make_norm(cfg) if cfg.norm in (Norm.SANDWICH, Norm.BRANCH) else None
        return first, out

    def attention_sublayers(self) -> list[tuple[nn.Module | None, Attention]]:
        """(input norm, attention) of each attention sub-layer, in order: where the placement
        normalises the input (pre, sandwich) the norm's input is the residual stream x the
        sub-layer adds to; otherwise the attention's input is (the norm is post-LN's norm of
        the sum, or None for branch norms)."""
        pairs = [(self.ln_attn, self.attn)]
        if self.cross is not None:
            pairs.append((self.ln_cross, self.cross))
        return pairs

    def _branch(self, x: torch.Tensor, ln: nn.Module | None, ln_out: nn.Module | None, f,
                point: str | None = None):  # fmt: skip
        """The sub-layer's addition to the stream (all placements but post); `point`: the
        sub-layer's name ("attn", "cross") where it has points."""
        h = f(ln(x) if ln is not None else x)
        return self.drop(self._at(point, "update", ln_out(h) if ln_out is not None else h))

    def _residual(self, x: torch.Tensor, ln: nn.Module | None, ln_out: nn.Module | None, f,
                  point: str | None = None):  # fmt: skip
        x = self._at(point, "resid_pre", x)
        if self.placement == Norm.POST:
            return ln(x + self.drop(self._at(point, "update", f(x))))
        return x + self._branch(x, ln, ln_out, f, point)

    def _at(self, sub: str | None, name: str, value: torch.Tensor) -> torch.Tensor:
        """`value` through the point `sub.name` (sub "": the block's own; None: no points)."""
        if self.points is None or sub is None:
            return value
        return at(self.points, f"{sub}.{name}" if sub else name, value)

    def forward(
        self,
        x: torch.Tensor,
        positions: torch.Tensor,
        key_mask: torch.Tensor | None = None,
        memory: torch.Tensor | None = None,
        memory_mask: torch.Tensor | None = None,
        cache: SiteCache | None = None,
        key_positions: torch.Tensor | None = None,
        stream: StreamRule | None = None,
    ) -> torch.Tensor:
        """x [batch, seq, d_model] -> [batch, seq, d_model]; memory is the encoder output. With
        `cache`, x is the new tokens and key_positions / key_mask cover every key; `stream`
        masks the streaming heads of a key/value plan."""

        def attend(h: torch.Tensor) -> torch.Tensor:
            return self.attn(h, None, positions, key_positions, key_mask, cache, stream)

        if self.parallel:  # GPT-NeoX's order of the sums: ffn + attn + x
            x = self._at("attn", "resid_pre", x)
            ffn = self._branch(x, self.ln_ffn, self.ln_ffn_out, self.ffn)
            attn = self._branch(x, self.ln_attn, self.ln_attn_out, attend, "attn")
            return self._at("", "resid_post", ffn + attn + x)
        x = self._residual(x, self.ln_attn, self.ln_attn_out, attend, "attn")
        if self.cross is not None:
            cross = self.cross
            x = self._residual(
                x,
                self.ln_cross,
                self.ln_cross_out,
                lambda h: cross(h, memory, positions, None, memory_mask),
                "cross",
            )
        if self.ffn is not None:
            x = self._residual(x, self.ln_ffn, self.ln_ffn_out, self.ffn)
        return self._at("", "resid_post", x)


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.positions = InputPositions(cfg)
        self.token_types = None
        if cfg.type_vocab_size:
            self.token_types = nn.Embedding(cfg.type_vocab_size, cfg.d_model)
        self.ln_embed = make_norm(cfg) if cfg.embed_norm else None
        self.drop = nn.Dropout(cfg.dropout)
        sites = cfg.sites()
        if cfg.arch == Arch.ENCODER_DECODER:
            n_enc = cfg.n_layer
            self.encoder = nn.ModuleList(Block(cfg, [s]) for s in sites[:n_enc])
            dec = sites[n_enc:]
            self.blocks = nn.ModuleList(
                Block(cfg, dec[2 * i : 2 * i + 2]) for i in range(len(dec) // 2)
            )
            self.ln_enc = make_norm(cfg) if self.final_norm else None
        else:
            self.encoder = None
            self.blocks = nn.ModuleList(Block(cfg, [s]) for s in sites)
        self.ln_final = make_norm(cfg) if self.final_norm else None
        self.head_dense = nn.Linear(cfg.d_model, cfg.d_model) if cfg.head_transform else None
        self.ln_head = make_norm(cfg) if cfg.head_transform else None
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=cfg.head_bias)
        self.apply(self._init)
        if cfg.tie_embeddings:
            self.head.weight = self.embed.weight

    @classmethod
    def empty(cls, cfg: ModelConfig, dtype: torch.dtype = torch.float32,
              device: torch.device | str = "cpu") -> Transformer:  # fmt: skip
        """The model `cfg` describes with uninitialized weights in `dtype` on `device`, for
        loading weights into: nothing is initialized or held in float32 on the way, so memory
        is one copy of the weights. Buffers computed from the config (rotary frequencies, which
        stay float32, and key/value indices) are recomputed."""
        with torch.device("meta"):
            model = cls(cfg)
        model.to(dtype=dtype)
        if torch.device(device).type != "meta":
            model.to_empty(device=device)
        if cfg.tie_embeddings:  # to_empty gives every parameter its own storage
            model.head.weight = model.embed.weight
        for module in model.modules():
            if hasattr(module, "reset_buffers"):
                module.reset_buffers()
        if torch.device(device).type != "meta":
            with torch.no_grad():
                for gate in model.gates():
                    gate.fill_(1.0)
        return model.eval()

    @property
    def final_norm(self) -> bool:
        """Every placement but post ends with a norm before the output layer."""
        return self.cfg.norm != Norm.POST

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=0.02)

    # ---------------------------------------------------------------- forward
    def _embed(
        self, tokens: torch.Tensor, positions: torch.Tensor, token_types: torch.Tensor | None = None
    ) -> torch.Tensor:
        x = self.embed(tokens)  # [batch, seq, d_model]
        if self.cfg.embed_scale:  # the factor in x's dtype, as Gemma rounds it
            x = x * torch.tensor(self.cfg.d_model**0.5, dtype=x.dtype)
        if self.token_types is not None:  # before positions, in BERT's order (same rounding)
            if token_types is None:
                token_types = torch.zeros_like(tokens)
            x = x + self.token_types(token_types)
        if self.positions.active:
            x = x + self.positions(positions).to(x.dtype)
        if self.ln_embed is not None:
            x = self.ln_embed(x)
        return self.drop(x)

    @staticmethod
    def _default_positions(tokens: torch.Tensor, positions: torch.Tensor | None) -> torch.Tensor:
        if positions is not None:
            return positions
        b, t = tokens.shape
        return torch.arange(t, device=tokens.device).expand(b, t)  # [batch, seq]

    def encode(
        self,
        source: torch.Tensor,
        positions: torch.Tensor | None = None,
        key_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Encoder of an encoder-decoder: source [batch, src] -> memory [batch, src, d_model]."""
        positions = self._default_positions(source, positions)
        x = self._embed(source, positions)
        for block in self.encoder:
            x = block(x, positions, key_mask)
        return self.ln_enc(x) if self.ln_enc is not None else x

    def features(
        self,
        tokens: torch.Tensor,
        source: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        source_positions: torch.Tensor | None = None,
        key_mask: torch.Tensor | None = None,
        source_mask: torch.Tensor | None = None,
        token_types: torch.Tensor | None = None,
        cache: KVCache | None = None,
        plan: Any = None,
        collect: list[torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """The last hidden state [batch, seq, d_model] (after the final norm); see `forward`.
        `collect`, a list, receives the residual stream after each decoder block, in order
        ([batch, seq, d_model] each, the blocks' `resid_post` points; distillation matches them
        layer by layer)."""
        rules = [None] * len(self.blocks)
        if plan is not None:
            if cache is not None:
                raise ValueError("a cache made by new_cache(plan) carries its plan; pass one")
            rules = self.stream_rules(plan)
        memory = None
        if self.encoder is not None:
            if source is None:
                raise ValueError("an encoder-decoder needs `source` tokens")
            memory = self.encode(source, source_positions, source_mask)
        if cache is not None and positions is None:  # the new tokens follow the cached ones
            positions = cache.length + self._default_positions(tokens, None)
        positions = self._default_positions(tokens, positions)
        key_positions = None
        if cache is not None:
            if self.cfg.arch != Arch.DECODER:
                raise ValueError("a key/value cache needs a decoder (causal self-attention)")
            key_positions, key_mask = cache.extend(positions, key_mask)
        if plan is not None or (cache is not None and cache.plan is not None):
            check_right_padded(key_mask)
        x = self._embed(tokens, positions, token_types)  # [batch, seq, d_model]
        n = 0 if collect is None else len(self.blocks)  # (no points: nothing to look up)
        with self.intervene({f"blocks.{i}.resid_post": collect.append for i in range(n)}):
            for i, block in enumerate(self.blocks):
                site = cache.sites[i] if cache is not None else None
                x = block(x, positions, key_mask, memory, source_mask, site, key_positions,
                          rules[i])  # fmt: skip
        if self.ln_final is not None:
            x = self.ln_final(x)
        return x

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """Hidden states [batch, seq, d_model] -> logits [batch, seq, vocab]."""
        if self.head_dense is not None:
            x = self.ln_head(activation(self.cfg.ffn, self.head_dense(x)))
        logits = self.head(x)  # [batch, seq, vocab]
        cap = self.cfg.final_softcap
        return logits if cap is None else torch.tanh(logits / cap) * cap

    def forward(
        self,
        tokens: torch.Tensor,
        source: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        source_positions: torch.Tensor | None = None,
        key_mask: torch.Tensor | None = None,
        source_mask: torch.Tensor | None = None,
        token_types: torch.Tensor | None = None,
        cache: KVCache | None = None,
        plan: Any = None,
    ) -> torch.Tensor:
        """tokens [batch, seq] -> logits [batch, seq, vocab].

        source [batch, src] is required for an encoder-decoder; positions default to 0..seq-1;
        key_mask / source_mask [batch, seq] are False at padding; token_types [batch, seq]
        (segments) default to 0 when the model has them. With `cache` (decoders; `new_cache`),
        tokens are the ones after those cached, which join the cache; key_mask is theirs. With
        `plan` (a `probe.kv.plan.KVPlan`, no cache) the plan's streaming heads see only its sink
        and window: the full forward an evicting `new_cache(plan)` decodes exactly."""
        x = self.features(
            tokens,
            source,
            positions,
            source_positions,
            key_mask,
            source_mask,
            token_types,
            cache,
            plan,
        )
        return self.logits(x)  # [batch, seq, vocab]

    def new_cache(self, plan: Any = None, masked: bool = True) -> KVCache:
        """An empty key/value cache for incremental decoding (`forward(..., cache=)`); with a
        `KVPlan`, its streaming heads keep only the plan's sink and window: at every query
        (`masked`, StreamingLLM's token-by-token rule) or after each call (the papers' prefill:
        a call's queries see what the cache held and the call's keys; `probe.model.cache`)."""
        if plan is None:
            return KVCache.empty(len(self.blocks))
        return KVCache.empty(len(self.blocks), self.stream_rules(plan, masked), plan)

    def stream_rules(self, plan: Any, masked: bool = True) -> list[StreamRule | None]:
        """Per block, how `plan` (checked against this model first) splits its heads."""
        if self.cfg.arch != Arch.DECODER:
            raise ProbeError(
                f"a key/value plan applies to decoders; this model is an {self.cfg.arch.value} "
                "(no cache to cut)."
            )
        plan.check(self.cfg)
        return plan_rules(plan, [block.attn.site for block in self.blocks], masked)

    # ------------------------------------------------------------ attention access
    def attention_modules(self) -> list[Attention]:
        """Attention sub-layers in site order (index = `layer` in every table)."""
        mods = [m for m in self.modules() if isinstance(m, Attention)]
        return sorted(mods, key=lambda m: m.layer)

    @contextmanager
    def observe(self, observer: Observer) -> Iterator[Observer]:
        """Attach `observer` to every attention sub-layer for the duration of the block."""
        mods = self.attention_modules()
        for m in mods:
            if m.observer is not None:
                raise RuntimeError("model is already being observed; nest observers in one")
        try:
            for m in mods:
                m.observer = observer
            yield observer
        finally:
            for m in mods:
                m.observer = None

    def intervene(self, fns: dict[str, Fn]) -> Intervention:
        """Inside `with model.intervene({point: fn}):`, each fn reads (returns None) or replaces
        (returns a value) what flows through its named point (`probe.model.points`, e.g.
        "blocks.3.attn.heads"); an unknown name is one line; nothing stays attached after."""
        return Intervention(self, fns)

    def gates(self) -> list[torch.Tensor]:
        """The per-head gate of each attention site, in site order ([head] each)."""
        return [m.gate for m in self.attention_modules()]

    @torch.no_grad()
    def set_gates(self, values: list[torch.Tensor] | None) -> None:
        """Set every gate (None: all ones)."""
        for i, m in enumerate(self.attention_modules()):
            m.gate.fill_(1.0) if values is None else m.gate.copy_(values[i])

    def parameter_counts(self) -> dict[str, int]:
        """Parameters per component (tied weights counted once)."""
        counts: dict[str, int] = {}
        seen: set[int] = set()
        for name, p in self.named_parameters():
            if id(p) in seen or name.endswith(".gate"):
                continue
            seen.add(id(p))
            parts = name.split(".")
            if parts[0] in ("blocks", "encoder") and len(parts) > 3:
                sub = parts[2]
                key = {"attn": "attention", "cross": "cross-attention", "ffn": "ffn"}.get(
                    sub, "layernorm"
                )
            elif parts[0] in ("embed", "head", "token_types", "head_dense"):
                key = "embedding"
            elif parts[0] == "positions":
                key = "positional"
            else:
                key = "layernorm"
            counts[key] = counts.get(key, 0) + p.numel()
        counts["total"] = sum(counts.values())
        return counts
