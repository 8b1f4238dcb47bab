"""Memory a model or a forward pass will need, estimated from the config before anything is
allocated, so an impossible size fails in one line instead of after minutes and gigabytes.

The estimates are upper-end orders of magnitude (weights at their dtype's size, activations in
float32), not exact accounting: they exist to refuse `d_model = 10**9` or a 100,000-token
evaluation, not to pack memory tightly.
`PROBE_MEMORY_CHECK=off` in the environment skips the check (to insist).
"""

from __future__ import annotations

import os

from probe.config import PE, ModelConfig
from probe.errors import ProbeError
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
    ffn = 2 * d * cfg.d_ff + cfg.d_ff + d if str(cfg.ffn) != "none" else 0
    sites = cfg.n_sites
    blocks = cfg.n_layer + (cfg.decoder_layers if str(cfg.arch) == "encoder-decoder" else 0)
    table = cfg.max_len * d if cfg.pe == PE.LEARNED else 0
    return cfg.vocab_size * d * 2 + table + sites * attention + blocks * (ffn + 6 * d)


def forward_bytes(cfg: ModelConfig, batch: int, seq: int, backward: bool = False) -> int:
    """Peak bytes of one forward pass (and its backward): the attention weights and score bias
    of one sub-layer ([batch, head, seq, seq], a few copies), every layer's activations when
    they are kept for the backward pass (else one layer's), and the logits over the vocabulary
    with their softmax and gradient, made once at the end."""
    scores = 3 * batch * cfg.n_head * seq * seq * FLOAT
    width = 8 * cfg.d_model + cfg.d_ff
    layers = cfg.n_sites if backward else 1
    kept = layers * (batch * seq * width * FLOAT + (scores if backward else 0))
    logits = 3 * batch * seq * cfg.vocab_size * FLOAT
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


def check_fits(need: int, what: str, smaller: str = "a smaller size") -> None:
    """Refuse `what` when `need` bytes exceed HEADROOM of the memory available, saying what to
    make smaller (PROBE_MEMORY_CHECK=off skips this)."""
    if os.environ.get(ENV, "").lower() in ("off", "0", "no"):
        return
    have = available_bytes()
    if have is not None and need > HEADROOM * have:
        raise ProbeError(
            f"{what} would need about {_gib(need)} of memory and {_gib(have)} is available; "
            f"use {smaller}, or set {ENV}=off to try anyway."
        )


def check_model(cfg: ModelConfig, training: bool = False, dtype=None) -> None:
    """The weights in `dtype` (default float32; and for training their gradients and Adam's
    two moments) must fit."""
    copies = TRAINING_COPIES if training else 1
    params = parameter_estimate(cfg)
    size = FLOAT if dtype is None else dtype.itemsize
    check_fits(params * size * copies, f"a model of about {params:,} parameters")


def check_forward(cfg: ModelConfig, batch: int, seq: int, backward: bool = False) -> None:
    check_fits(
        forward_bytes(cfg, batch, seq, backward),
        f"a batch of {counted(batch, 'sequence')} of {counted(seq, 'token')}",
    )


def data_bytes(n_batches: int, batch: int, seq: int) -> int:
    """Bytes of `n_batches` prepared batches of `batch` sequences of `seq` tokens, held at once."""
    return n_batches * batch * seq * TOKEN_DATA


def check_batches(cfg: ModelConfig, n_batches: int, batch: int, seq: int,
                  backward: bool = False, smaller: str = "a smaller size") -> None:  # fmt: skip
    """A command that prepares `n_batches` batches of `batch` sequences of at most `seq` tokens,
    then runs the model on each (with `backward`, its gradients too), must fit: refused before
    the first batch is made, with the memory it would need."""
    check_fits(
        data_bytes(n_batches, batch, seq) + forward_bytes(cfg, batch, seq, backward),
        f"{counted(n_batches, 'batch')} of {counted(batch, 'sequence')} of {counted(seq, 'token')}",
        smaller,
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
    import subprocess
    import sys

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
