"""Micro-batches and the chunked loss: every analysis run a few tokens at a time equals the same
analysis on whole batches, and the chunked loss equals the plain full-logits cross-entropy (values
and gradients), in float32."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from probe.analysis.attention import inspect_batches
from probe.config import ModelConfig
from probe.data.tasks import Batch, TaskConfig
from probe.errors import ProbeError
from probe.measure.batching import micro_batches, row_tokens, split_batch
from probe.measure.evaluate import batch_loss, eval_batches, evaluate, text_metrics
from probe.measure.loss import per_example, token_losses
from probe.model import Transformer
from probe.pruning.curves import score_batches
from probe.pruning.estimators.ablation import mean_loss
from probe.pruning.fisher import reconstruction_error, tune_masks
from probe.pruning.importance import head_importance
from probe.pruning.layer_drop import layer_importance

TASK = TaskConfig(n_symbols=6)
ONE_ROW = 1  # a budget below one example's tokens: every pass holds a single example
WHOLE = 10**9  # a budget no batch reaches: every batch in one pass


def make_model(arch="decoder", pe="rope", seed=0, vocab=TASK.vocab_size, **kw) -> Transformer:
    torch.manual_seed(seed)
    cfg = ModelConfig(arch=arch, vocab_size=vocab, n_layer=2, n_head=3, d_model=12, pe=pe, **kw)
    model = Transformer(cfg)
    with torch.no_grad():  # larger weights than the init, so heads differ clearly
        for p in model.parameters():
            if p.requires_grad:
                p.normal_(0, 0.4)
    return model.eval()


def task_batches(arch="decoder", size=7):
    return eval_batches(TASK, arch, [3, 5], size, 2, 0)


def text_batch(vocab: int, rows: int = 6, seq: int = 9, objective="causal-lm") -> Batch:
    """A causal-LM batch of random tokens, as `probe.data.text` builds them."""
    ids = torch.randint(0, vocab, (rows, seq), generator=torch.Generator().manual_seed(3))
    targets = torch.zeros_like(ids)
    targets[:, :-1] = ids[:, 1:]
    mask = torch.zeros_like(ids, dtype=torch.bool)
    mask[:, :-1] = True
    return Batch(ids, targets, mask, None, seq, objective=objective)


def _values(x) -> torch.Tensor:
    if isinstance(x, torch.Tensor):
        return x.detach().double()
    return torch.tensor(np.array(x, dtype=np.float64))


def close(a, b, rel=1e-5):
    """a equals b up to float32 rounding (relative to b's largest value)."""
    a, b = _values(a), _values(b)
    assert torch.allclose(a, b, rtol=rel, atol=rel * float(b.abs().max().clamp_min(1e-12)))


# ------------------------------------------------------------------------- the splitting
def test_split_batch_keeps_every_row_in_order_within_the_budget():
    (batch,) = eval_batches(TASK, "encoder-decoder", [4], 10, 1, 0)
    per_row = row_tokens(batch)  # inputs and source
    assert per_row == batch.inputs.shape[1] + batch.source.shape[1]
    parts = split_batch(batch, 3 * per_row + 1)
    assert [p.inputs.shape[0] for p in parts] == [3, 3, 3, 1]
    for name in ("inputs", "targets", "loss_mask", "source"):
        joined = torch.cat([getattr(p, name) for p in parts])
        assert torch.equal(joined, getattr(batch, name))
    assert split_batch(batch, WHOLE) == [batch]
    assert [p.inputs.shape[0] for p in split_batch(batch, ONE_ROW)] == [1] * 10
    assert len(list(micro_batches([batch, batch], ONE_ROW))) == 20


@pytest.mark.parametrize("bad", [0, -5, 2.5, True])
def test_a_budget_that_is_not_a_positive_count_is_refused(bad):
    (batch,) = eval_batches(TASK, "decoder", [4], 4, 1, 0)
    with pytest.raises(ProbeError, match="max-batch-tokens"):
        split_batch(batch, bad)


# ------------------------------------------------------------------------ the chunked loss
def test_chunked_loss_equals_the_full_logits_loss_and_its_gradients():
    vocab = 50
    model = make_model(vocab=vocab, head_bias=True)
    batch = text_batch(vocab)
    hidden = model.features(batch.inputs)  # [batch, seq, d]
    rows = hidden[batch.loss_mask].detach().requires_grad_(True)  # [scored, d]
    targets = batch.targets[batch.loss_mask]
    # the reference: one [tokens, vocab] tensor, plain cross-entropy
    full = F.cross_entropy(model(batch.inputs)[batch.loss_mask], targets, reduction="none")
    chunked = token_losses(model, rows, targets, chunk=3 * vocab)  # 3 rows per chunk
    close(chunked, full)
    # gradients through the checkpointed chunks: w.r.t. the hidden states and the head weights
    weights = torch.randn(len(targets))
    (g_rows, g_head) = torch.autograd.grad((chunked * weights).sum(), [rows, model.head.weight])
    plain_rows = rows.detach().requires_grad_(True)
    plain = F.cross_entropy(model.logits(plain_rows), targets, reduction="none")
    (p_rows, p_head) = torch.autograd.grad((plain * weights).sum(), [plain_rows, model.head.weight])
    close(g_rows, p_rows)
    close(g_head, p_head)


def test_batch_loss_per_example_equals_the_plain_cross_entropy():
    model = make_model()
    for batch in task_batches():
        logits = model(batch.inputs)  # [batch, seq, vocab]
        token = F.cross_entropy(logits.transpose(1, 2), batch.targets, reduction="none")
        mask = batch.loss_mask.float()
        want = (token * mask).sum(1) / mask.sum(1)
        close(batch_loss(model, batch, "none"), want)
    scored = torch.tensor([[True, False, True], [False, False, False]])
    each = per_example(torch.tensor([1.0, 3.0]), scored)
    assert each.tolist() == [2.0, 0.0]  # (1 + 3) / 2; a row with nothing scored gives 0


# --------------------------------------------------- analyses: tiny budget == whole batches
@pytest.mark.parametrize(
    "method", ["gradient", "fisher", "ablation", "mean-ablation", "entropy", "confidence"]
)
@pytest.mark.parametrize("arch", ["decoder", "encoder-decoder"])
def test_importance_in_micro_batches_equals_whole_batches(method, arch):
    model = make_model(arch=arch)
    data = task_batches(arch)
    small = head_importance(model, data, method, max_batch_tokens=ONE_ROW)
    whole = head_importance(model, data, method, max_batch_tokens=WHOLE)
    assert len(small) == len(whole) == 2 * 3 * (3 if arch == "encoder-decoder" else 1)
    close(small["value"].to_numpy(), whole["value"].to_numpy())


def test_losses_and_scores_in_micro_batches_equal_whole_batches():
    model = make_model()
    data = task_batches()
    close(mean_loss(model, data, ONE_ROW), mean_loss(model, data, WHOLE))
    small, whole = score_batches(model, data, ONE_ROW), score_batches(model, data, WHOLE)
    for key in whole:
        close(small[key], whole[key])
    a = evaluate(model, TASK, [3, 5], batch_size=5, n_batches=2, max_batch_tokens=ONE_ROW)
    b = evaluate(model, TASK, [3, 5], batch_size=5, n_batches=2, max_batch_tokens=WHOLE)
    close(a["value"].to_numpy(), b["value"].to_numpy())


def test_text_metrics_in_micro_batches_equal_the_full_logits_computation():
    vocab = 40
    model = make_model(vocab=vocab)
    data = [text_batch(vocab, rows=5), text_batch(vocab, rows=3)]
    got = text_metrics(model, data, "causal-lm", accuracy=True, max_batch_tokens=ONE_ROW)
    total = right = count = 0.0
    for b in data:  # independent: full logits, plain cross-entropy
        logits = model(b.inputs)[b.loss_mask].double()  # [scored, vocab]
        total += float(F.cross_entropy(logits, b.targets[b.loss_mask], reduction="sum"))
        right += float((logits.argmax(-1) == b.targets[b.loss_mask]).sum())
        count += int(b.loss_mask.sum())
    close(got["loss"], total / count)
    assert got["token_accuracy"] == right / count
    assert got["tokens"] == count


def test_layer_importance_tuning_and_attention_tables_do_not_depend_on_the_budget():
    model = make_model(norm="pre")
    data = task_batches()
    close(
        layer_importance(model, data, ONE_ROW)["value"].to_numpy(),
        layer_importance(model, data, WHOLE)["value"].to_numpy(),
    )
    removed = [(0, 1), (1, 0)]
    for procedure in ("layer-by-layer", "one-pass"):
        small = tune_masks(model, removed, data, procedure, max_batch_tokens=ONE_ROW)
        whole = tune_masks(model, removed, data, procedure, max_batch_tokens=WHOLE)
        for s, w in zip(small, whole, strict=True):
            close(s, w, rel=1e-4)  # least squares over sums: a little more rounding
    scales = [torch.ones(3), torch.tensor([0.0, 1.0, 1.0])]
    close(reconstruction_error(model, data, scales, ONE_ROW),
          reconstruction_error(model, data, scales, WHOLE))  # fmt: skip
    a = inspect_batches(model, data, [3, 5], max_batch_tokens=ONE_ROW)
    b = inspect_batches(model, data, [3, 5], max_batch_tokens=WHOLE)
    close(a.stats["value"].to_numpy(), b.stats["value"].to_numpy())
    close(a.roles["value"].to_numpy(), b.roles["value"].to_numpy())


# ------------------------------------------------------------ recompute, memory, timing
def test_recomputed_blocks_give_the_same_gate_gradients_and_leave_the_model_as_it_was():
    from probe.measure.recompute import recomputed_blocks

    model = make_model(arch="encoder-decoder", pe="sinusoidal")
    (batch,) = eval_batches(TASK, "encoder-decoder", [4], 5, 1, 0)
    gates = model.gates()
    for g in gates:
        g.requires_grad_(True)

    def gate_grads():
        return torch.autograd.grad(batch_loss(model, batch), gates)

    plain = gate_grads()
    with recomputed_blocks(model):
        again = gate_grads()
    for a, b in zip(again, plain, strict=True):
        close(a, b)
    blocks = list(model.encoder) + list(model.blocks)
    assert all("forward" not in vars(b) for b in blocks)  # the class's forward again


def test_gradient_importance_with_recomputed_blocks_equals_without(monkeypatch):
    import probe.pruning.gate_gradients as gate_gradients

    model = make_model()
    data = task_batches()
    plain = head_importance(model, data, "fisher")
    monkeypatch.setattr(gate_gradients, "RECOMPUTE_ABOVE", 0)  # every backward recomputes
    recomputed = head_importance(model, data, "fisher")
    close(recomputed["value"].to_numpy(), plain["value"].to_numpy())


def test_the_memory_check_sizes_by_the_micro_batch(monkeypatch):
    import probe.measure.memory as memory

    cfg = ModelConfig(arch="decoder", vocab_size=50_000, n_layer=30, n_head=9, d_model=576)
    whole = memory.forward_bytes(cfg, 64, 128, backward=True)
    parts = memory.forward_bytes(cfg, 64, 128, backward=True, max_batch_tokens=4096)
    one_pass = memory.forward_bytes(cfg, 32, 128, backward=True)  # what a micro-batch holds
    assert parts < one_pass < whole  # and less still: its logits come in chunks
    half = memory.forward_bytes(cfg, 64, 128, max_batch_tokens=4096, dtype=torch.bfloat16)
    assert half < memory.forward_bytes(cfg, 64, 128, max_batch_tokens=4096)
    monkeypatch.setattr(memory, "available_bytes", lambda: int(whole))  # room for parts only
    memory.check_batches(cfg, 2, 64, 128, backward=True, max_batch_tokens=4096)
    with pytest.raises(ProbeError, match="409,600 tokens at a time"):
        memory.check_batches(cfg, 2, 6400, 128, backward=True, max_batch_tokens=409_600)
    with pytest.raises(ProbeError, match="would need about"):
        memory.check_batches(cfg, 2, 64, 128, backward=True)  # the whole batch at once


def test_timing_keeps_to_its_budget_and_an_exact_count_without_one():
    from probe.pruning.heads import head_mask
    from probe.pruning.timing import Gated, time_forward, timing_batches

    model = make_model()
    before = [g.clone() for g in model.gates()]
    variants = {"original": model, "masked": Gated(model, head_mask(model, [(0, 1)]))}
    sizes = timing_batches(task_batches()[0], (1, 2, 4))
    exact = time_forward(variants, sizes, warmup=1, repeats=3)
    assert set(exact["repeats"]) == {3} and sorted(set(exact["batch_size"])) == [1, 2, 4]
    tight = time_forward(variants, sizes, warmup=1, repeats=3, budget=0.0)
    assert set(tight["batch_size"]) == {1} and set(tight["repeats"]) == {1}
    for g, b in zip(model.gates(), before, strict=True):
        assert torch.equal(g, b)  # the masked variant's gates were not left behind
