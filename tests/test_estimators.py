"""Importance estimators are modules that declare themselves: a toy estimator added in this file
alone runs through `head_importance`, `probe importance`, the correlations and the plots; each
built-in declaration agrees with what its estimator computes."""

from __future__ import annotations

import subprocess
import sys

import pandas as pd
import pytest
import torch
from scipy.stats import spearmanr
from test_microbatch import make_model as microbatch_model

from probe.data.tasks import TaskConfig
from probe.errors import ProbeError
from probe.measure.evaluate import eval_batches
from probe.model import Transformer
from probe.pruning.choices import parse_methods
from probe.pruning.estimators import ESTIMATORS, Estimator
from probe.pruning.heads import ranking
from probe.pruning.importance import head_importance, importance_correlations

TASK = TaskConfig(name="copy", n_symbols=6)
BUILT_IN = ("gradient", "fisher", "ablation", "mean-ablation", "confidence", "entropy", "random")


def make_model(seed: int = 0) -> Transformer:
    return microbatch_model(pe="learned", seed=seed, vocab=TASK.vocab_size, max_len=32)


def batches(seed: int = 0, size: int = 6):
    return eval_batches(TASK, "decoder", [2, 4], size, 1, seed)


# ------------------------------------------------------------------ a toy estimator, here only
def weight_norm(model, batches, given):
    """The Frobenius norm of each kept head's slice of the output projection."""
    values = []
    for m in model.attention_modules():
        w = m.o.weight.detach().double()  # [d_model, kept head * d_head]
        values.append(torch.stack([w[:, i * m.d_head : (i + 1) * m.d_head].norm()
                                   for i in range(m.n_kept)]))  # fmt: skip
    return values


TOY = Estimator("weight-norm", "output weight norm ‖W_o,h‖", "norm of the head's output weights",
                weight_norm)  # fmt: skip


def expected_norms(state: dict[str, torch.Tensor], n_layer: int, n_head: int) -> pd.Series:
    """(layer, head) -> norm, from the saved weights: o.weight [d_model, head * d_head] read as
    [d_model, head, d_head]."""
    values = {}
    for layer in range(n_layer):
        w = state[f"blocks.{layer}.attn.o.weight"].double()
        per_head = w.reshape(w.shape[0], n_head, -1)  # [d_model, head, d_head]
        for h in range(n_head):
            values[(layer, h)] = float(torch.sqrt((per_head[:, h, :] ** 2).sum()))
    return pd.Series(values)


def test_the_registry_holds_the_built_in_estimators_in_their_order_without_torch():
    assert ESTIMATORS.names() == BUILT_IN
    assert parse_methods("all") == list(BUILT_IN)
    code = ("import sys; from probe.pruning.estimators import ESTIMATORS; ESTIMATORS.names(); "
            "import probe.pruning.choices; assert 'torch' not in sys.modules, 'torch'")  # fmt: skip
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_a_toy_estimator_runs_through_head_importance_correlations_and_plots():
    from probe.report.pruning_plots import importance_heatmap

    model = make_model()
    model.attention_modules()[1].gate.data[2] = 0.0  # a masked head: no row
    data = batches()
    with ESTIMATORS.added(TOY):
        assert parse_methods("all")[-1] == "weight-norm"  # after the built-ins
        table = head_importance(model, data, "weight-norm")
        gradient = head_importance(model, data, "gradient")
        corr = importance_correlations(pd.concat([gradient, table], ignore_index=True))
        fig = importance_heatmap(pd.concat([gradient, table], ignore_index=True))
    want = expected_norms(model.state_dict(), 2, 3).drop((1, 2))
    got = table.set_index(["layer", "head"])["value"]
    assert set(table["method"]) == {"weight-norm"}
    assert got.sort_index().to_numpy() == pytest.approx(want.sort_index().to_numpy(), rel=1e-12)
    both = gradient.set_index(["layer", "head"])["value"].loc[got.index]
    rho = corr.set_index(["method", "other"])["rho"][("weight-norm", "gradient")]
    assert rho == pytest.approx(spearmanr(got, both)[0])
    assert [ax.get_title() for ax in fig.axes if ax.get_title()][1] == TOY.label
    with pytest.raises(ProbeError, match="Unknown importance method 'weight-norm'"):
        head_importance(model, data, "weight-norm")  # gone after the block


def test_a_toy_estimator_runs_from_the_command_line(tmp_path):
    from probe_cli.main import app
    from typer.testing import CliRunner

    from probe.checkpoint import save_checkpoint
    from probe.train_config import TrainConfig

    model = make_model()
    ckpt = save_checkpoint(tmp_path / "ck", model, TASK, TrainConfig(train_len=(2, 4)), {})
    out = tmp_path / "out"
    args = ["importance", str(ckpt), "--method", "weight-norm,gradient", "--out", str(out)]
    with ESTIMATORS.added(TOY):
        result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    table = pd.read_csv(out / "importance.csv")
    got = table[table["method"] == "weight-norm"].set_index(["layer", "head"])["value"]
    want = expected_norms(model.state_dict(), 2, 3)
    assert got.sort_index().to_numpy() == pytest.approx(want.sort_index().to_numpy(), rel=1e-9)
    corr = pd.read_csv(out / "correlations.csv")
    assert set(corr["method"]) == {"weight-norm", "gradient"}
    assert (out / "correlations.png").is_file() and "weight-norm importance" in result.output
    again = CliRunner().invoke(app, [*args, "--overwrite"])  # without the toy: refused by name
    assert isinstance(again.exception, ProbeError)
    assert "Unknown importance method 'weight-norm'" in str(again.exception)


# ---------------------------------------------------------- declarations agree with the values
def test_low_is_important_matches_what_entropy_and_confidence_measure():
    """Head 0 of the first site attends uniformly (its queries are zero), head 1 sharply (its
    queries scaled up): every estimator that reads the pattern must rank head 1 above head 0
    once its declared direction is applied (entropy: low is important)."""
    model = make_model()
    attn = model.attention_modules()[0]
    d = attn.d_head
    with torch.no_grad():
        attn.q.weight[:d].zero_()  # [d_head, d_model]: head 0's query rows
        attn.q.bias[:d].zero_()
        attn.q.weight[d : 2 * d] *= 50.0
    for name in ("entropy", "confidence"):
        table = head_importance(model, batches(), name)
        score = ranking(table).set_index(["layer", "head"])["score"]
        assert score[(0, 1)] > score[(0, 0)], name
        raw = table.set_index(["layer", "head"])["value"]
        assert (raw[(0, 1)] < raw[(0, 0)]) == ESTIMATORS.get(name).low_is_important


@pytest.mark.parametrize("name", [e.name for e in ESTIMATORS if e.data_parallel])
def test_data_parallel_estimators_are_means_of_per_example_sums(name):
    """Declared data-parallel: the value on two parts of the data is the example-weighted mean of
    the values on each part (what adding per-head sums over processes relies on)."""
    model = make_model()
    first, second = batches(seed=1, size=4), batches(seed=2, size=8)
    n1, n2 = (sum(b.inputs.shape[0] for b in part) for part in (first, second))
    whole = head_importance(model, [*first, *second], name)["value"].to_numpy()
    a = head_importance(model, first, name)["value"].to_numpy()
    b = head_importance(model, second, name)["value"].to_numpy()
    assert whole == pytest.approx((n1 * a + n2 * b) / (n1 + n2), rel=1e-5)


def test_only_estimators_declaring_gradients_differentiate():
    """Under inference mode no graph can be built: an estimator that declares no gradients runs,
    one that declares them cannot."""
    model, data = make_model(), batches()
    for declared in ESTIMATORS:
        with torch.inference_mode():
            if declared.gradients:
                with pytest.raises(RuntimeError):
                    head_importance(model, data, declared.name)
            else:
                assert head_importance(model, data, declared.name)["value"].notna().all()


def test_an_estimator_giving_values_of_the_wrong_shape_is_named():
    from dataclasses import replace

    def too_many(model, batches, given):
        return [torch.ones(m.n_kept + 1) for m in model.attention_modules()]

    said = (
        r"the too-many estimator gave values of shapes \[\(4,\), \(4,\)\], not one per "
        r"kept head of each attention site \[\(3,\), \(3,\)\]"
    )
    toy = replace(TOY, name="too-many", compute=too_many)
    with ESTIMATORS.added(toy), pytest.raises(ProbeError, match=said):
        head_importance(make_model(), batches(), "too-many")
