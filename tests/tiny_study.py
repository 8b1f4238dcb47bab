"""The tiny study file the study tests share: 1-layer models, a few steps, seconds to run."""

import json

SMOKE = """
[smoke]
train.steps = 2
[smoke.grid]
train.seed = [0]
"""


def tiny_study(
    steps: int = 4,
    pes: tuple[str, ...] = ("learned", "rope"),
    question: str = "Does the runner work?",
    seed_key: str = "train.seed",
    extra: str = "",
) -> str:
    """A study of len(pes) x 2 seeds copy models; `extra` is appended (expectations, smoke)."""
    return f"""
[study]
name = "tiny"
question = "{question}"

[base.model]
n_layer = 1
n_head = 2
d_model = 16
max_len = 32

[base.task]
name = "copy"
n_symbols = 4

[base.train]
steps = {steps}
batch_size = 4
warmup = 1
train_len = [2, 3]
eval_every = 0
eval_batches = 1

[grid]
model.pe = {json.dumps(list(pes))}
{seed_key} = [0, 1]

[analysis.eval_lengths]
lengths = "1:2L"
batch_size = 4
n_batches = 1
{extra}"""
