"""A key/value-plan method is one module that declares itself (`probe.kv.methods`): a toy
method added with `METHODS.added` plans from Python and from `probe kv-plan --method ... --set
...` without touching any other file; the declarations import without torch; the built-in
methods' options keep their study keys (cached step keys) and flags."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
from cli_run import exit_code
from test_kv_plan import planted, save

from probe.errors import ProbeError
from probe.kv.methods import METHODS, KVMethod, head_methods, method_help
from probe.kv.plan import KVPlan
from probe.kv.planning import make_plan
from probe.options import option


@dataclass(frozen=True)
class LastLayersOptions:
    layers: int = option(1, low=1, help="last layers whose key/value heads keep the full cache")


def _fits(cfg, options: LastLayersOptions, named) -> None:
    if options.layers > cfg.n_layer:
        raise ProbeError(f"{named('layers')} {options.layers} is more than the model's "
                         f"{cfg.n_layer} layers.")  # fmt: skip


def _scores(model, options: LastLayersOptions, seed, sink, window, prompts, say):
    import pandas as pd

    from probe.kv.planning import HEAD_COLUMNS, kv_scores

    first = model.cfg.n_layer - options.layers
    values = [float(s.index >= first) for s in model.cfg.sites() for _ in s.kept_groups]
    return pd.DataFrame(columns=HEAD_COLUMNS), kv_scores(model.cfg, "last-layers", values), {}


LAST_LAYERS = KVMethod("last-layers", 70, "the last layers' key/value heads",
                       options=LastLayersOptions, study_prefix="last", scores=_scores,
                       fits=_fits)  # fmt: skip


def test_a_toy_method_plans_from_python_and_is_gone_after_the_block():
    model = planted(n_kv_head=2)  # 2 layers of 2 key/value heads
    last = model.cfg.sites()[-1]
    with METHODS.added(LAST_LAYERS):
        assert "last-layers" in head_methods()
        result = make_plan(model, "last-layers", 0.5, 4, 8, options={"layers": 1})
        # the budget is 2 of 4 heads: exactly the last layer's, by hand from the config
        assert result.plan.full == ((), last.kept_groups)
        assert result.scores.value.tolist() == [0.0, 0.0, 1.0, 1.0]
        with pytest.raises(ProbeError, match=r"^layers 3 is more than the model's 2 layers\.$"):
            make_plan(model, "last-layers", 0.5, 4, 8, options={"layers": 3})
        with pytest.raises(ProbeError, match=r"^layers must be at least 1 \(last layers"):
            make_plan(model, "last-layers", 0.5, 4, 8, options=LastLayersOptions(layers=0))
    assert "last-layers" not in METHODS
    with pytest.raises(ProbeError, match=r"Unknown kv-plan method 'last-layers'\. Available: "
                       r"retrieval, razor, razor-max, duo, random, streaming, full\."):  # fmt: skip
        KVPlan("last-layers", 0.5, 4, 8, ((), ()))


def test_a_toy_method_runs_from_the_command_line_with_set(tmp_path, capsys):
    ckpt = save(tmp_path / "m", planted(n_kv_head=2))
    out = tmp_path / "plan"
    args = ["kv-plan", str(ckpt), "--method", "last-layers", "--full-heads", "0.5", "--sink",
            "2", "--window", "16"]  # fmt: skip
    with METHODS.added(LAST_LAYERS):
        assert exit_code([*args, "--set", "layers=1", "--out", str(out)]) == 0
        assert KVPlan.read(out) == KVPlan("last-layers", 0.5, 2, 16, ((), (0, 1)))
        settings = json.loads((out / "manifest.json").read_text())["settings"]
        assert settings["layers"] == 1 and settings["method"] == "last-layers"
        capsys.readouterr()
        for bad, said in [("layers=3", "--set layers 3 is more than the model's 2 layers."),
                          ("layers=0", "--set layers must be at least 1 (last layers"),
                          ("layrs=1", "Unknown last-layers option 'layrs'. Did you mean "
                                      "'layers'?")]:  # fmt: skip
            assert exit_code([*args, "--set", bad, "--out", str(tmp_path / "bad")]) == 2
            err = capsys.readouterr().err.strip()
            assert said in err and len(err.splitlines()) == 1, err
            assert not (tmp_path / "bad").exists()


def test_set_and_the_flags_give_one_plan_and_bounds_name_the_flag(tmp_path, capsys):
    ckpt = save(tmp_path / "m", planted())
    base = ["kv-plan", str(ckpt), "--method", "razor", "--full-heads", "0.25", "--sink", "2",
            "--window", "16"]  # fmt: skip
    assert exit_code([*base, "--period", "16", "--rows", "4", "--out", str(tmp_path / "a")]) == 0
    assert exit_code([*base, "--set", "period=16", "--set", "rows=4", "--out",
                      str(tmp_path / "b")]) == 0  # fmt: skip
    assert KVPlan.read(tmp_path / "a") == KVPlan.read(tmp_path / "b")
    for name in ("scores.csv", "heads.csv"):
        assert (tmp_path / "a" / name).read_text() == (tmp_path / "b" / name).read_text()
    capsys.readouterr()
    period = "--period must be at least 2 (random tokens per copy of the repeated sequence)"
    for extra, said in [
        (["--period", "1"], f"{period}, got 1."),
        (["--set", "period=1"], "--set " + period[2:] + ", got 1."),  # named as given
        (["--method", "duo", "--lr", "nan"], "--lr must be a finite number"),
        # a flag of another method is checked by that method's bounds, as before the methods
        # declared themselves
        (["--lr", "nan"], "--lr must be a finite number"),
        (["--method", "streaming", "--needles", "-5"], "--needles must be at least 1"),
    ]:
        assert exit_code([*base, *extra, "--out", str(tmp_path / "bad")]) == 2
        err = capsys.readouterr().err.strip()
        assert said in err and len(err.splitlines()) == 1, err


def test_the_built_in_methods_keep_their_study_keys_and_help():
    from probe.study.heads.steps.kv import _scoring

    kv = SimpleNamespace(score_needles=20, score_context=256, razor_period=64, razor_rows=8,
                         razor_induction_ratio=0.14, razor_echo_ratio=0.01, razor_buffer_ratio=0.0,
                         razor_compensate=True, razor_max_period=64, razor_max_rows=8,
                         duo_steps=40, duo_lr=0.05, duo_l1=0.05, duo_warmup=0.2,
                         duo_prompt_tokens=1024, duo_passkeys=2, duo_train_sink=0,
                         duo_train_window=0)  # fmt: skip
    study = SimpleNamespace(kv=kv)
    # the dicts the steps hashed before the methods declared themselves (cached step keys)
    assert _scoring(study, "retrieval") == {"score_needles": 20, "score_context": 256}
    # razor-max hashes as razor did (under its own keys); razor chooses as published
    assert _scoring(study, "razor-max") == {"razor_max_period": 64, "razor_max_rows": 8}
    assert _scoring(study, "razor") == {"razor_period": 64, "razor_rows": 8,
                                        "razor_induction_ratio": 0.14, "razor_echo_ratio": 0.01,
                                        "razor_buffer_ratio": 0.0,
                                        "razor_compensate": True}  # fmt: skip
    assert _scoring(study, "duo") == {"duo_steps": 40, "duo_lr": 0.05, "duo_l1": 0.05,
                                      "duo_warmup": 0.2, "duo_prompt_tokens": 1024,
                                      "duo_passkeys": 2, "duo_train_sink": 0,
                                      "duo_train_window": 0}  # fmt: skip
    assert _scoring(study, "random") == {}
    assert METHODS.names() == ("retrieval", "razor", "razor-max", "duo", "random", "streaming",
                               "full")  # fmt: skip
    assert head_methods() == ("retrieval", "razor", "razor-max", "duo", "random")
    assert method_help() == (
        "retrieval (Wu et al. 2024), razor (RazorAttention as published: the top 14% of "
        "key/value heads by induction score and 1% by echo score), razor-max (the larger of "
        "RazorAttention's echo and induction scores: probe's razor until it chose as "
        "published), duo (DuoAttention's gates trained on passkey prompts), random, streaming "
        "(no full heads) or full (every head full)."
    )


def test_the_declarations_import_without_torch():
    code = ("import sys; from probe.kv.methods import METHODS, method_help; METHODS.names(); "
            "method_help(); heavy = [m for m in ('torch', 'pandas') if m in sys.modules]; "
            "assert not heavy, heavy")  # fmt: skip
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_the_study_kv_section_carries_each_method_s_declared_options():
    from probe.options import check, describe
    from probe.study.heads.steps.kv import KVOptions

    lines = describe(KVOptions).splitlines()
    assert (
        "razor_period = 64 (at least 2): razor: random tokens per copy of the repeated "
        "sequence" in lines
    )
    assert "score_needles = 20 (at least 1): retrieval: needle prompts" in lines  # its own default
    assert (
        "duo_lr = 0.05 (at least 1e-09): duo: Adam's peak learning rate on the gates; the "
        "reference: 0.02 over 2,000 steps"
    ) in lines
    with pytest.raises(ProbeError, match=r"^s\.toml \[kv\] razor_period must be at least 2 "):
        check(KVOptions(razor_period=1), "s.toml [kv]")


def test_a_method_s_study_keys_must_not_clash():
    from dataclasses import replace

    import probe.study.heads.steps.kv as kv_step

    @dataclass(frozen=True)
    class Period:
        period: int = option(2, low=1, help="a period")

    @dataclass(frozen=True)
    class Rows:
        rows: int = option(2, low=1, help="rows")

    with METHODS.added(replace(LAST_LAYERS, name="np", study_prefix="")):  # prefix: its name
        assert [k for k, _, _ in METHODS.get("np").study_fields()] == ["np_layers"]
        assert "np_layers" in [k for k, _, _ in kv_step._method_fields()]
    clash = replace(LAST_LAYERS, name="clash", study_prefix="razor", options=Period, rank=80)
    with (
        METHODS.added(clash),
        pytest.raises(
            ProbeError,
            match=r"the clash method's \[kv\] key "
            r"'razor_period' is taken by the razor method",
        ),
    ):
        kv_step._method_fields()
    loss = replace(LAST_LAYERS, name="loss", study_prefix="loss", options=Rows)
    with (
        METHODS.added(loss),
        pytest.raises(
            ProbeError,
            match=r"'loss_rows' is taken by the "
            r"\[kv\] section",
        ),
    ):
        kv_step._method_fields()


def test_option_values_from_python_are_typed():
    with pytest.raises(ProbeError, match=r"the razor method field 'period' must be an integer"):
        METHODS.get("razor").read({"period": True})
    with pytest.raises(ProbeError, match=r"field 'period' must be an integer"):
        METHODS.get("razor").read({"period": 2.5})
