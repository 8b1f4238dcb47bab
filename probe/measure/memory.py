"""Memory a model or a forward pass will need, estimated from the config before anything is
allocated, so an impossible size fails in one line instead of after minutes and gigabytes.

The estimates are upper-end orders of magnitude (weights and activations at the weights'
dtype's size, attention scores and logits in float32), not exact accounting: they exist to
refuse `d_model = 10**9` or a 100,000-token evaluation, not to pack memory tightly. A command
that runs its batches in micro-batches of a token budget (`probe.measure.batching`) is sized by one
micro-batch, not by its statistical batch: the data of every batch is held, but only one
micro-batch's activations.
`PROBE_MEMORY_CHECK=off` in the environment skips the check (to insist).
"""

from __future__ import annotations

import os
import subprocess
import sys

from probe.config import PE, ModelConfig
from probe.errors import ProbeError
from probe.measure.batching import rows_per_pass
from probe.measure.loss import LOSS_CHUNK
from probe.words import counted

FLOAT = 4  # bytes per float32
TOKEN_DATA = 40  # bytes a token of prepared data holds: long ids, targets, positions; bool masks
ENV = "PROBE_MEMORY_CHECK"
HEADROOM = 0.75  # refuse what would need more than this share of the available memory
TRAINING_COPIES = 5  # weights, gradients, Adam's two moments, and a transient copy


def parameter_estimate(cfg: ModelConfig) -> int:
    """Parameters of the model `cfg` describes (biases and norms included, within a few %)."""
    d, inner, kv = cfg.d_model, cfg.n_head * (cfg.d_head or 0), cfg.kv_heads * (cfg.d_head or 0)
    attention = 2 * d * (inner + kv) + 2 * (inner + kv)
    matrices = 3 if str(cfg.ffn) == "swiglu" else 2  # SwiGLU: gate, up and down projections
    ffn = matrices * d * cfg.d_ff + cfg.d_ff + d if str(cfg.ffn) != "none" else 0
    sites = cfg.n_sites
    blocks = cfg.n_layer + (cfg.decoder_layers if str(cfg.arch) == "encoder-decoder" else 0)
    table = cfg.max_len * d if cfg.pe == PE.LEARNED else 0
    return cfg.vocab_size * d * 2 + table + sites * attention + blocks * (ffn + 6 * d)


def forward_bytes(cfg: ModelConfig, batch: int, seq: int, backward: bool = False,
                  max_batch_tokens: int | None = None, dtype=None) -> int:  # fmt: skip
    """Peak bytes of one forward pass (and its backward): the attention weights and score bias
    of one sub-layer ([batch, head, seq, seq], a few copies), every layer's activations when
    they are kept for the backward pass (else one layer's), and the logits over the vocabulary
    with their softmax and gradient.

    max_batch_tokens: the pass runs in micro-batches of that many tokens (whole rows, at least
    one) and its loss projects at most `probe.measure.loss.LOSS_CHUNK` logits at a time, so `batch`
    counts only up to a micro-batch, and a backward pass recomputes each block's activations
    (`probe.measure.recompute`) instead of keeping them; None: the whole batch at once with all its
    logits and every layer's activations kept (as training runs). dtype: the activations'
    (default float32)."""
    size = FLOAT if dtype is None else dtype.itemsize
    rows = batch if max_batch_tokens is None else min(batch, rows_per_pass(seq, max_batch_tokens))
    scores = 3 * rows * cfg.n_head * seq * seq * FLOAT
    width = 8 * cfg.d_model + cfg.d_ff
    layers = cfg.n_sites if backward else 1
    kept = layers * (rows * seq * width * size + (scores if backward else 0))
    logits = 3 * rows * seq * cfg.vocab_size * FLOAT
    if max_batch_tokens is not None:
        logits = min(logits, 3 * max(LOSS_CHUNK, cfg.vocab_size) * FLOAT)
        # a backward pass recomputes blocks (probe.measure.recompute): each keeps its input and
        # its head outputs
        if backward:
            kept = cfg.n_sites * rows * seq * 2 * cfg.d_model * size + 2 * (kept // layers)
    return scores + kept + logits


def available_bytes() -> int | None:
    """Memory this machine can still give (MemAvailable), or None where it cannot be read."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _gib(n: float) -> str:
    """Bytes in the binary unit that reads best: 1.5 GiB, 12.0 TiB, 3.2 PiB."""
    for unit in ("GiB", "TiB"):
        if n < 2**40:
            return f"{n / 2**30:,.1f} {unit}"
        n /= 2**10
    return f"{n / 2**30:,.1f} PiB"


def model_bytes(model) -> int:
    """Bytes a model's parameters and buffers hold."""
    tensors = [*model.parameters(), *model.buffers()]
    return sum(t.numel() * t.element_size() for t in {id(t): t for t in tensors}.values())


def room_for(need: int) -> bool:
    """Whether `need` more bytes fit in HEADROOM of the memory available (True where it cannot
    be read, or with PROBE_MEMORY_CHECK=off)."""
    if os.environ.get(ENV, "").lower() in ("off", "0", "no"):
        return True
    have = available_bytes()
    return have is None or need <= HEADROOM * have


def check_fits(need: int, what: str, smaller: str = "a smaller size", how: str = "") -> None:
    """Refuse `what` when `need` bytes exceed HEADROOM of the memory available, saying what to
    make smaller and (`how`) how it would run (PROBE_MEMORY_CHECK=off skips this)."""
    if os.environ.get(ENV, "").lower() in ("off", "0", "no"):
        return
    have = available_bytes()
    if have is not None and need > HEADROOM * have:
        raise ProbeError(
            f"{what} would need about {_gib(need)} of memory{how} and {_gib(have)} is "
            "available; "
            f"use {smaller}, or set {ENV}=off to try anyway."
        )


def check_model(cfg: ModelConfig, training: bool = False, dtype=None) -> None:
    """The weights in `dtype` (default float32; and for training their gradients and Adam's
    two moments) must fit."""
    copies = TRAINING_COPIES if training else 1
    params = parameter_estimate(cfg)
    size = FLOAT if dtype is None else dtype.itemsize
    check_fits(params * size * copies, f"a model of about {params:,} parameters")


def check_forward(cfg: ModelConfig, batch: int, seq: int, backward: bool = False,
                  max_batch_tokens: int | None = None, dtype=None) -> None:  # fmt: skip
    """One batch's forward pass (micro-batched with `max_batch_tokens`) must fit."""
    check_fits(
        forward_bytes(cfg, batch, seq, backward, max_batch_tokens, dtype),
        f"a batch of {counted(batch, 'sequence')} of {counted(seq, 'token')}",
        how=_in_parts(max_batch_tokens),
    )


def _in_parts(max_batch_tokens: int | None) -> str:
    if max_batch_tokens is None:
        return ""
    return f" (run {max_batch_tokens:,} tokens at a time)"


def data_bytes(n_batches: int, batch: int, seq: int) -> int:
    """Bytes of `n_batches` prepared batches of `batch` sequences of `seq` tokens, held at once."""
    return n_batches * batch * seq * TOKEN_DATA


def check_batches(cfg: ModelConfig, n_batches: int, batch: int, seq: int,
                  backward: bool = False, smaller: str = "a smaller size",
                  max_batch_tokens: int | None = None, dtype=None) -> None:  # fmt: skip
    """A command that prepares `n_batches` batches of `batch` sequences of at most `seq` tokens,
    then runs the model on each (with `backward`, its gradients too; with `max_batch_tokens`,
    in micro-batches of that many tokens), must fit: refused before the first batch is made,
    with the memory it would need."""
    check_fits(
        data_bytes(n_batches, batch, seq)
        + forward_bytes(cfg, batch, seq, backward, max_batch_tokens, dtype),
        f"{counted(n_batches, 'batch')} of {counted(batch, 'sequence')} of {counted(seq, 'token')}",
        smaller,
        _in_parts(max_batch_tokens),
    )


# A launcher as small as a Python process gets: it forks, runs the command, and reports the
# command's own peak. (Linux keeps a process's peak resident memory across fork and exec, so a
# command started straight from a large process, such as a test run, would report at least
# that process's size.)
_LAUNCHER = (
    "import os, sys\n"
    "pid = os.fork()\n"
    "if pid == 0:\n"
    "    os.execvp(sys.argv[1], sys.argv[1:])\n"
    "_, status, usage = os.wait4(pid, 0)\n"
    "code = os.waitstatus_to_exitcode(status)\n"
    "os.write(1, b'\\nPROBE-PEAK %d %d\\n' % (usage.ru_maxrss, code))\n"
)


def peak_rss(argv: list[str], env: dict | None = None) -> tuple[int, int, str]:
    """Run `argv` as a child process: (its peak resident memory in bytes, its exit code, what it
    printed). The peak is the kernel's account of that process alone (wait4's ru_maxrss)."""
    done = subprocess.run(
        [sys.executable, "-S", "-c", _LAUNCHER, *argv], capture_output=True,
        env={**os.environ, **(env or {})},
    )  # fmt: skip
    output = done.stdout.decode("utf-8", "replace") + done.stderr.decode("utf-8", "replace")
    head, _, last = output.rpartition("PROBE-PEAK ")
    try:
        peak_kib, code = (int(x) for x in last.split()[:2])
    except ValueError:
        return 0, done.returncode or 1, output
    return peak_kib * 1024, code, head.rstrip() + "\n" + last.split("\n", 1)[-1].lstrip()
