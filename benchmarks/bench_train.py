"""Training throughput: probe's Transformer against torch.nn.TransformerEncoder, same sizes,
causal, same batch, same optimizer, measured alternately in one process.

    python benchmarks/bench_train.py [--threads 1] [--steps 30]

Prints tokens per second for both and the ratio probe / torch (target >= 1.0 on the CPU).
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

from probe.config import ModelConfig
from probe.model import Transformer


class TorchLM(nn.Module):
    """The reference: embeddings + nn.TransformerEncoder (pre-LN, ReLU, causal) + tied head."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.max_len, cfg.d_model)
        layer = nn.TransformerEncoderLayer(
            cfg.d_model, cfg.n_head, cfg.d_ff, dropout=0.0, batch_first=True, norm_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, cfg.n_layer, enable_nested_tensor=False)
        self.ln = nn.LayerNorm(cfg.d_model)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        x = self.embed(tokens) + self.pos(torch.arange(t, device=tokens.device))
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=tokens.device)
        x = self.encoder(x, mask=mask, is_causal=True)
        return self.ln(x) @ self.embed.weight.T


def step_time(model: nn.Module, opt, tokens: torch.Tensor, repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        logits = model(tokens)
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--seq", type=int, default=64)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    sizes = [
        ModelConfig(n_layer=2, n_head=4, d_model=64, vocab_size=32, pe="learned"),
        ModelConfig(n_layer=3, n_head=4, d_model=128, vocab_size=32, pe="learned"),
    ]
    print(f"threads: {torch.get_num_threads()}, batch {args.batch}, seq {args.seq}")
    for cfg in sizes:
        models = {"probe": Transformer(cfg), "torch": TorchLM(cfg)}
        opts = {k: torch.optim.AdamW(m.parameters(), lr=1e-4) for k, m in models.items()}
        tokens = torch.randint(0, cfg.vocab_size, (args.batch, args.seq))
        for k, m in models.items():  # warm-up
            step_time(m, opts[k], tokens, 3)
        samples = {k: [] for k in models}
        for _ in range(args.rounds):  # alternate so drift hits both alike
            for k, m in models.items():
                samples[k] += step_time(m, opts[k], tokens, args.steps)
        tps = {k: args.batch * args.seq / statistics.median(v) for k, v in samples.items()}
        print(
            f"d_model {cfg.d_model}, {cfg.n_layer} layers: probe {tps['probe']:,.0f} tok/s, "
            f"torch.nn.TransformerEncoder {tps['torch']:,.0f} tok/s, "
            f"ratio {tps['probe'] / tps['torch']:.2f}"
        )


if __name__ == "__main__":
    main()
