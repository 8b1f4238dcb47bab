"""Why scores are divided by sqrt(d_k) (Vaswani et al. 2017, section 3.2.1), with numbers.

Part 1, at initialization: q and k with independent unit-variance components, so q.k has mean 0
and variance d_k. Unscaled, the logits' spread grows like sqrt(d_k), the softmax saturates (rows
become near one-hot) and its gradient vanishes; scaled by 1/sqrt(d_k) the variance stays 1 and
the entropy near log n - 1/2 (for Gaussian logits of std sigma, H ~ log n - sigma^2 / 2).

Part 2, in training: models identical but for the scale (1/sqrt(d_k), 1, 1/d_k), trained on the
same data; their loss and per-head attention statistics as training goes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence

import pandas as pd
import torch

from probe.config import ModelConfig, Scale
from probe.data.tasks import TaskConfig
from probe.errors import ProbeError
from probe.fields import choice
from probe.measure.streaming import row_statistics
from probe.model import AttentionCall
from probe.site import Site
from probe.train_config import TrainConfig
from probe.training.train import train  # training sits above analysis; import it when asked

D_KS = (8, 16, 32, 64, 128, 256, 512)
NS = (128, 1024)
SCALES = ("sqrt", "none", "inverse")
INIT_COLUMNS = ["d_k", "n", "scale", "statistic", "value"]
TRAIN_COLUMNS = ["d_k", "scale", "step", "layer", "head", "statistic", "value"]
TRAIN_STATISTICS = ("entropy", "normalized_entropy", "max_logit", "p_max_gt_0.9")


def scale_factor(scale: Scale | str, d_k: int) -> float:
    """The factor on q.k: 1/sqrt(d_k), 1 or 1/d_k."""
    scale = choice(Scale, scale, "attention scale")
    factors = {Scale.SQRT: d_k**-0.5, Scale.NONE: 1.0, Scale.INVERSE: 1.0 / d_k}
    if scale not in factors:
        raise ProbeError(f"scale '{scale}' has no fixed factor; use sqrt, none or inverse.")
    return factors[scale]


def softmax_statistics(
    d_k: int, n: int, factor: float, n_queries: int, generator: torch.Generator
) -> dict[str, float]:
    """Statistics of softmax(factor * q.k) for n_queries random queries against n random keys,
    all components N(0, 1)."""
    q = torch.randn(n_queries, d_k, generator=generator, dtype=torch.float64)
    k = torch.randn(n, d_k, generator=generator, dtype=torch.float64)
    scores = (q @ k.T) * factor  # [query, key]
    p = scores.softmax(-1)  # [query, key]
    p2, p3 = p.square().sum(-1), p.pow(3).sum(-1)  # [query]
    # ||diag(p) - p p^T||_F^2 = sum p^2 - 2 sum p^3 + (sum p^2)^2, without the n x n Jacobian
    jacobian = (p2 - 2 * p3 + p2.square()).clamp_min(0).sqrt()
    call = AttentionCall(
        Site("scaling", 0, False, False, 1, 1, (0,)),
        q.float().view(1, 1, n_queries, d_k),
        k.float().view(1, 1, n, d_k),
        k.float().view(1, 1, n, d_k),
        torch.tensor([factor], dtype=torch.float32),
        None,
        None,
        None,
    )
    names = [
        "entropy",
        "normalized_entropy",
        "p_max",
        "p_max_gt_0.9",
        "p_max_gt_0.99",
        "effective_keys",
    ]
    rows = row_statistics(call, names)
    predicted = d_k * factor**2
    out = {
        "score_var": float(scores.var()),
        "score_var_predicted": predicted,
        "score_std": float(scores.std()),
        "entropy_predicted": math.log(n) - predicted / 2,
        "log_n": math.log(n),
        "softmax_jacobian_norm": float(jacobian.mean()),
    }
    out.update({name: float(v.mean()) for name, v in rows.items()})
    return out


def init_scaling(
    d_ks: Iterable[int] = D_KS,
    ns: Iterable[int] = NS,
    scales: Iterable[str] = SCALES,
    n_queries: int = 512,
    seed: int = 0,
) -> pd.DataFrame:
    """Part 1: a tidy table with columns d_k, n, scale, statistic, value. Statistics:
    score_var (measured) and score_var_predicted (d_k x factor^2), score_std, entropy,
    entropy_predicted (log n - var / 2, good while the std is well below sqrt(2 ln n)),
    normalized_entropy, effective_keys, p_max, p_max_gt_0.9, p_max_gt_0.99 (fractions of
    near-one-hot rows) and softmax_jacobian_norm (mean Frobenius norm of the softmax Jacobian)."""
    d_ks, ns, scales = list(d_ks), list(ns), [str(choice(Scale, s, "scale")) for s in scales]
    if not d_ks or not ns or not scales or min(d_ks) < 1 or min(ns) < 2 or n_queries < 2:
        raise ProbeError("init_scaling needs d_k >= 1, n >= 2, at least 2 queries and a scale.")
    generator = torch.Generator().manual_seed(seed)
    records = []
    for d_k in d_ks:
        for n in ns:
            for scale in scales:
                stats = softmax_statistics(d_k, n, scale_factor(scale, d_k), n_queries, generator)
                records += [
                    {"d_k": d_k, "n": n, "scale": scale, "statistic": name, "value": v}
                    for name, v in stats.items()
                ]
    return pd.DataFrame(records, columns=INIT_COLUMNS)


def scaling_model(d_k: int, scale: str, vocab_size: int, n_layer: int = 2) -> ModelConfig:
    """The part-2 model: a decoder with two heads of width d_k on a 64-wide residual stream."""
    return ModelConfig(
        arch="decoder",
        vocab_size=vocab_size,
        n_layer=n_layer,
        n_head=2,
        d_model=64,
        d_head=d_k,
        scale=scale,
        pe="learned",
    )


def train_scaling(
    d_k: int = 256,
    scales: Sequence[str] = SCALES,
    *,
    steps: int = 300,
    task: TaskConfig | None = None,
    train_len: tuple[int, int] = (4, 16),
    stats_every: int = 25,
    seed: int = 0,
    lr: float = 3e-3,
    device: str = "auto",
    progress: Callable[[str, object], None] | None = None,
) -> pd.DataFrame:
    """Part 2: train one model per scale (same data, same initial weights up to the scale) and
    return their curves: a tidy table with columns d_k, scale, step, layer, head, statistic,
    value; statistic is loss and exact_match (layer and head empty) or a per-head attention
    statistic from TRAIN_STATISTICS, logged every `stats_every` steps."""
    task = task or TaskConfig()
    if steps < 1 or stats_every < 1:
        raise ProbeError("steps and stats_every must be at least 1.")
    frames = []
    for scale in scales:
        scale = str(choice(Scale, scale, "attention scale"))
        cfg = scaling_model(d_k, scale, task.vocab_size)
        train_cfg = TrainConfig(
            steps=steps,
            train_len=train_len,
            seed=seed,
            lr=lr,
            warmup=min(40, steps),
            eval_every=0,
            stats_every=stats_every,
            device=device,
        )
        report = (lambda p, scale=scale: progress(scale, p)) if progress else None
        metrics = train(cfg, task, train_cfg, progress=report).metrics
        frames.append(_curves(metrics, d_k, scale))
    return pd.concat(frames, ignore_index=True)


def _curves(metrics: pd.DataFrame, d_k: int, scale: str) -> pd.DataFrame:
    """The training log's loss, final exact match and attention statistics, tidied."""
    loss = metrics[(metrics.split == "train") & (metrics.metric == "loss")]
    final = metrics[(metrics.split == "eval") & (metrics.metric == "exact_match")]
    final = final.groupby("step", as_index=False).value.mean()
    attn = metrics[(metrics.split == "attention") & metrics.metric.isin(TRAIN_STATISTICS)]
    attn = attn.groupby(["step", "layer", "head", "metric"], as_index=False).value.mean()
    parts = [
        loss.assign(statistic="loss")[["step", "statistic", "value"]],
        final.assign(statistic="exact_match")[["step", "statistic", "value"]],
        attn.rename(columns={"metric": "statistic"}),
    ]
    out = pd.concat(parts, ignore_index=True).assign(d_k=d_k, scale=scale)
    return out.reindex(columns=TRAIN_COLUMNS)
