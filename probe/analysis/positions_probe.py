"""How does the model know where it is? A linear probe for absolute position in the residual stream.

A decoder without positional encoding (NoPE) still learns order: the causal mask lets token t
attend to exactly t + 1 tokens, so even uniform attention to the first token yields a 1/(t + 1)
signal. An encoder without positions has no such leak: it is permutation-equivariant,
f(x[π]) = f(x)[π], and `permutation_gap` measures how far a model is from that.

`position_probe` fits, for each layer l of the residual stream (0: the embedding output, the input
of the first block; l >= 1: the output of block l, before any final norm), a ridge regression

    pos ≈ h_l(token) · w_l + b_l        (closed form in float64, intercept not penalised)

on sequences at the training lengths, then scores it on fresh sequences at every test length,
where positions past the longest training sequence were never seen by the probe.

Which tokens: every input token that is a task symbol (id >= N_SPECIAL), i.e. not PAD, BOS, SEP,
EOS or MASK. A special token's identity alone gives its position away (BOS is always 0, SEP always
follows the prompt), so including it would credit the embedding with position knowledge it does
not have. With the layout of `probe.data.tasks` this is, per form:

    decoder          inputs [BOS] prompt [SEP] answer     -> prompt and answer symbols
    encoder          inputs [BOS] prompt [SEP] [MASK]*k   -> prompt symbols
    encoder-decoder  decoder inputs [BOS] answer          -> answer symbols (the decoder stack)

Task batches hold one length each and so carry no padding; PAD tokens would be skipped anyway.
The target is the token's index in `inputs`, the position `forward_batch` gives it (0..seq-1).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pandas as pd
import torch

from probe.config import Arch
from probe.data.tasks import BOS, N_SPECIAL, SEP, Batch, TaskConfig, sequence_length
from probe.errors import ProbeError
from probe.measure.evaluate import check_lengths, eval_batches, form_for, forward_batch
from probe.measure.memory import check_forward
from probe.model import Transformer

COLUMNS = ["layer", "length", "seen", "metric", "value", "n_tokens"]
METRICS = ("r2", "accuracy", "mae")


# ------------------------------------------------------------------------------ hidden states
@torch.no_grad()
def hidden_states(model: Transformer, batches: Sequence[Batch]) -> list[torch.Tensor]:
    """The residual stream at each layer for `batches` (all of one sequence length), in eval mode:
    element 0 is the embedding output (the first block's input), element l the output of block l;
    each [rows, seq, d_model] with rows the batches' examples stacked, on the model's device. For an
    encoder-decoder these are the decoder blocks (points `blocks.0.attn.resid_pre` and
    `blocks.N.resid_post`, detached before returning)."""
    if not batches:
        raise ProbeError("hidden_states needs at least one batch.")
    widths = {b.inputs.shape[1] for b in batches}
    if len(widths) > 1:
        raise ProbeError(
            f"hidden_states stacks batches of one sequence length, got lengths {sorted(widths)}; "
            "call it once per length."
        )
    per_batch: list[list[torch.Tensor]] = []
    current: list[torch.Tensor] = []

    def keep(x: torch.Tensor) -> None:
        current.append(x.detach())  # [batch, seq, d_model]

    points = {"blocks.0.attn.resid_pre": keep}
    points.update({f"blocks.{i}.resid_post": keep for i in range(len(model.blocks))})
    device = next(model.parameters()).device
    was_training = model.training
    try:
        model.eval()
        with model.intervene(points):
            for batch in batches:
                current = []
                forward_batch(model, batch.to(device))
                per_batch.append(current)
    finally:
        model.train(was_training)
    return [torch.cat(layer) for layer in zip(*per_batch, strict=True)]


# ------------------------------------------------------------------------------ ridge regression
class RidgeSums:
    """Sufficient statistics of a linear regression with intercept, gathered batch by batch in
    float64 (features shifted by the first batch's mean, so that centring later loses nothing)."""

    def __init__(self) -> None:
        self.n = 0
        self.shift: torch.Tensor | None = None  # [d]
        self.sx = self.xx = self.xy = None  # [d], [d, d], [d]
        self.sy = 0.0

    def add(self, x: torch.Tensor, y: torch.Tensor) -> None:
        """x [n, d], y [n]."""
        x, y = x.double(), y.double()
        if self.shift is None:
            self.shift = x.mean(0)  # [d]
            d = x.shape[1]
            self.sx = x.new_zeros(d)
            self.xx = x.new_zeros(d, d)
            self.xy = x.new_zeros(d)
        x = x - self.shift  # [n, d]
        self.n += x.shape[0]
        self.sx += x.sum(0)
        self.xx += x.T @ x  # [d, d]
        self.xy += x.T @ y  # [d]
        self.sy += float(y.sum())

    def solve(self, ridge: float) -> tuple[torch.Tensor, float]:
        """(w [d], b) minimising |y - x w - b|^2 + λ|w|^2 with λ = ridge * tr(C) / d, C the
        centred Gram matrix: `ridge` is relative to the features' mean variance, so the fit does
        not depend on their scale. ridge=0 is least squares (minimum norm when x is rank-deficient,
        as behind a LayerNorm)."""
        if self.shift is None or self.n < 2:
            raise ProbeError("a linear probe needs at least two tokens to fit.")
        mean_x = self.sx / self.n  # [d]
        mean_y = self.sy / self.n
        cxx = self.xx - self.n * torch.outer(mean_x, mean_x)  # [d, d]
        cxy = self.xy - self.n * mean_x * mean_y  # [d]
        d = cxx.shape[0]
        penalty = ridge * float(cxx.diagonal().sum()) / d
        a = (cxx + penalty * torch.eye(d, dtype=cxx.dtype, device=cxx.device)).cpu()
        w = torch.linalg.lstsq(a, cxy.cpu().unsqueeze(1), driver="gelsd").solution[:, 0]  # [d]
        w = w.to(cxx.device)
        b = mean_y - float((mean_x + self.shift) @ w)
        return w, b


def fit_ridge(x: torch.Tensor, y: torch.Tensor, ridge: float = 1e-3) -> tuple[torch.Tensor, float]:
    """Ridge regression y ≈ x w + b in closed form (float64): x [n, d], y [n] -> (w [d], b).
    See `RidgeSums.solve` for how `ridge` is scaled."""
    if ridge < 0:
        raise ProbeError(f"ridge must not be negative, got {ridge}.")
    sums = RidgeSums()
    sums.add(x, y)
    return sums.solve(ridge)


# ------------------------------------------------------------------------------ the probe
def _symbols(batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """Mask of the probed tokens [batch, seq] and their positions [batch, seq]."""
    keep = batch.inputs >= N_SPECIAL  # [batch, seq]
    b, t = batch.inputs.shape
    positions = torch.arange(t, device=batch.inputs.device).expand(b, t)  # [batch, seq]
    return keep, positions


class _Scores:
    """Running r2 / accuracy / mae of one layer's probe at one length."""

    def __init__(self) -> None:
        self.n = 0
        self.sse = self.sy = self.syy = self.abs = self.right = 0.0

    def add(self, pred: torch.Tensor, y: torch.Tensor) -> None:
        """pred, y [n] float64."""
        err = pred - y  # [n]
        self.n += y.numel()
        self.sse += float((err**2).sum())
        self.sy += float(y.sum())
        self.syy += float((y**2).sum())
        self.abs += float(err.abs().sum())
        self.right += float((pred.round() == y).sum())

    def values(self) -> dict[str, float]:
        sst = self.syy - self.sy**2 / self.n
        r2 = 1.0 - self.sse / sst if sst > 0 else float("nan")
        return {"r2": r2, "accuracy": self.right / self.n, "mae": self.abs / self.n}


def _check(
    model: Transformer,
    task: TaskConfig,
    lengths: list[int],
    batch_size: int,
    n_batches: int,
    ridge: float,
) -> None:
    if model.cfg.vocab_size < task.vocab_size:
        raise ProbeError(
            f"the model's vocabulary ({model.cfg.vocab_size}) is smaller than task "
            f"'{task.name}' needs ({task.vocab_size}); probe it on the task it was trained on."
        )
    if ridge < 0:
        raise ProbeError(f"ridge must not be negative, got {ridge}.")
    for name, value in (("batch_size", batch_size), ("n_batches", n_batches)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ProbeError(f"{name} must be a whole number of at least 1, got {value!r}.")
    check_lengths(model, task, lengths)
    longest = sequence_length(task, form_for(model.cfg.arch), max(lengths))
    check_forward(model.cfg, batch_size, longest)


@torch.no_grad()
def position_probe(
    model: Transformer,
    task: TaskConfig,
    train_lengths: Sequence[int],
    test_lengths: Sequence[int],
    *,
    batch_size: int = 64,
    n_batches: int = 2,
    seed: int = 0,
    ridge: float = 1e-3,
    progress: Callable[[int, int], None] | None = None,
) -> pd.DataFrame:
    """Linear decodability of absolute position from each layer of the residual stream.

    Fits one ridge probe per layer on `n_batches` batches per training length (data seed `seed`)
    and scores it on fresh data at each test length (seed `seed + 1 + length`, never the training
    data). Returns a tidy table with columns layer (0: embedding output, l: after block l), length,
    seen (the length is one of the training lengths), metric ("r2", "accuracy": the rounded
    prediction equals the position, "mae": mean absolute error in positions), value, n_tokens (test
    tokens scored). R^2 is against the variance of the positions at that length, so it can go
    below 0 where the probe extrapolates badly. `progress(done, total)` counts batches."""
    train_lengths, test_lengths = list(train_lengths), list(test_lengths)
    if not train_lengths or not test_lengths:
        raise ProbeError("position_probe needs at least one training and one test length.")
    _check(model, task, train_lengths + test_lengths, batch_size, n_batches, ridge)
    device = next(model.parameters()).device
    form = form_for(model.cfg.arch)
    total = n_batches * (len(train_lengths) + len(test_lengths))
    done = 0

    def step() -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done, total)

    sums: list[RidgeSums] = []
    for batch in eval_batches(task, form, train_lengths, batch_size, n_batches, seed):
        batch = batch.to(device)
        keep, positions = _symbols(batch)
        states = hidden_states(model, [batch])  # per layer [batch, seq, d_model]
        sums = sums or [RidgeSums() for _ in states]
        for layer, h in zip(sums, states, strict=True):
            layer.add(h[keep], positions[keep])  # [tokens, d_model], [tokens]
        step()
    d_model = sums[0].xx.shape[0]
    if sums[0].n <= d_model:
        raise ProbeError(
            f"the probe has {sums[0].n} training tokens for {d_model} features; raise "
            "batch_size or n_batches so that it sees more tokens than the model is wide."
        )
    probes = [s.solve(ridge) for s in sums]  # (w [d_model], b) per layer

    rows = []
    seen = set(train_lengths)
    for n in test_lengths:
        scores = [_Scores() for _ in probes]
        for batch in eval_batches(task, form, [n], batch_size, n_batches, seed + 1 + n):
            batch = batch.to(device)
            keep, positions = _symbols(batch)
            y = positions[keep].double()  # [tokens]
            states = hidden_states(model, [batch])
            for score, (w, b), h in zip(scores, probes, states, strict=True):
                score.add(h[keep].double() @ w + b, y)  # [tokens]
            step()
        for layer, score in enumerate(scores):
            for metric, value in score.values().items():
                rows.append({"layer": layer, "length": n, "seen": n in seen, "metric": metric,
                             "value": value, "n_tokens": score.n})  # fmt: skip
    return pd.DataFrame(rows, columns=COLUMNS)


# ------------------------------------------------------------------------------ permutations
@torch.no_grad()
def permutation_gap(model: Transformer, batch: Batch, *, seed: int = 0) -> float:
    """max |f(x[π]) - f(x)[π]| over the final hidden states f (`Transformer.features`) of an
    encoder, with π a random permutation (from `seed`) of the prompt positions, the tokens between
    BOS and the first SEP, the rest left in place. 0 up to float error for an encoder without
    positional encoding (permutation-equivariant); clearly positive once positions are encoded."""
    if model.cfg.arch != Arch.ENCODER:
        raise ProbeError(
            f"permutation_gap needs an encoder (arch 'encoder'), got '{model.cfg.arch}': a causal "
            "mask is never permutation-equivariant, whatever the positional encoding."
        )
    tokens = batch.inputs  # [batch, seq]
    seps = (tokens[0] == SEP).nonzero()
    if int(tokens[0, 0]) != BOS or not len(seps) or not (tokens[:, 0] == BOS).all():
        raise ProbeError("permutation_gap needs a task batch laid out as [BOS] prompt [SEP] ...")
    n_prompt = int(seps[0]) - 1
    if n_prompt < 2:
        raise ProbeError(f"a prompt of {n_prompt} token(s) cannot be permuted; use a longer task.")
    generator = torch.Generator().manual_seed(int(seed))
    shuffle = torch.randperm(n_prompt, generator=generator)  # [n_prompt]
    if (shuffle == torch.arange(n_prompt)).all():
        shuffle = shuffle.roll(1)  # never the identity
    perm = torch.arange(tokens.shape[1])  # [seq]
    perm[1 : 1 + n_prompt] = 1 + shuffle
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    try:
        tokens = tokens.to(device)
        perm = perm.to(device)
        out = model.features(tokens)  # [batch, seq, d_model]
        out_perm = model.features(tokens[:, perm])  # [batch, seq, d_model]
    finally:
        model.train(was_training)
    return float((out_perm.double() - out[:, perm].double()).abs().max())
