"""A stand-in rank for the launcher tests: `python -m launch_rank PIDS MODE [RANK CODE]`.

Each rank ties itself to its parent as a real one does (`tie_to_parent`), writes its pid to
PIDS/<rank>, then: MODE `sleep` waits for ever (a rank blocked in a collective); MODE `fail`
makes rank RANK write a warning and an error line and exit with CODE while the others wait."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from probe.training.launch import tie_to_parent


def main(argv: list[str]) -> None:
    pids, mode = Path(argv[0]), argv[1]
    rank = int(os.environ["RANK"])
    tie_to_parent()
    (pids / f"{rank}.tmp").write_text(str(os.getpid()))
    (pids / f"{rank}.tmp").rename(pids / str(rank))
    if mode == "fail" and rank == int(argv[2]):
        sys.stderr.write(f"a warning\nerror: rank {rank} found a bad input\n")
        sys.exit(int(argv[3]))
    while True:
        time.sleep(0.1)


if __name__ == "__main__":
    main(sys.argv[1:])
