"""`python -m probe_cli ...` (and `torchrun -m probe_cli ...`): the same as the `probe` command."""

from probe_cli.main import main

main()
