"""`python -m probe ...` (and `torchrun --nproc-per-node N -m probe train ...`): the `probe`
command, for launchers that start a module rather than a script."""

from probe_cli.main import main

main()
