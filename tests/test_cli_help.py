"""The command line's help, version and option errors: quick because they import nothing heavy
(torch, pandas, matplotlib, scipy: checked in a fresh interpreter, so no earlier test's imports
count), every command's help ends with an example, and flags are shown as flags."""

from __future__ import annotations

import subprocess
import sys

import pytest
from cli_run import HEAVY, in_fresh_interpreter
from probe_cli.main import app
from typer.testing import CliRunner

COMMANDS = [["train"], ["eval"], ["info"], ["import"], ["export"], ["inspect"], ["scaling"],
            ["importance"], ["prune"], ["view"], ["study"], ["study", "run"], ["study", "ls"],
            ["study", "validate"], ["study", "report"], ["generate"], ["kv-plan"]]  # fmt: skip


def run_probe(*args: str) -> tuple[dict, str]:
    """`probe ARGS` in a fresh interpreter: (exit code and heavy modules imported, stdout)."""
    done = in_fresh_interpreter(list(args))
    return {"code": done.code, "heavy": done.heavy}, done.out


def test_importing_the_command_line_imports_nothing_heavy():
    code = f"import sys, probe_cli.main; print([m for m in {HEAVY!r} if m in sys.modules])"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)  # fmt: skip
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize(
    "args",
    [["--help"], ["--version"], ["train", "--help"], ["study", "run", "--help"],
     ["prune", "--help"], ["train", "--bogus"], ["view", "x", "--out"]],
)  # fmt: skip
def test_help_version_and_option_errors_load_no_model_code(args):
    result, _ = run_probe(*args)
    assert result["heavy"] == [], f"probe {' '.join(args)} imported {result['heavy']}"
    assert result["code"] == (2 if args[0] != "--help" and "--help" not in args
                              and args != ["--version"] else 0)  # fmt: skip


def test_version_is_the_installed_package_version():
    from importlib.metadata import version

    result, out = run_probe("--version")
    assert result["code"] == 0 and out.strip() == f"probe {version('probe')}"


@pytest.mark.parametrize("command", COMMANDS, ids=" ".join)
def test_every_help_ends_with_an_example_and_shows_flags_as_flags(command):
    result = CliRunner().invoke(app, [*command, "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "<bool>" not in result.output  # a flag takes no value
    if command != ["study"]:
        after_options = result.output.rsplit("╰", 1)[-1]  # below the last panel
        epilog = " ".join(after_options.replace("─", " ").replace("╯", " ").split())
        assert epilog.startswith("Example: probe " + " ".join(command)), epilog


def test_scaling_defaults_are_the_analysis_grid():
    """`probe scaling`'s --d-ks and --ns defaults are written out (importing the analysis for
    them would load torch): they must stay the analysis module's grid."""
    import inspect as pyinspect

    from probe_cli.scaling import scaling_cli

    from probe.analysis.scaling import D_KS, NS

    params = pyinspect.signature(scaling_cli).parameters
    assert params["d_ks"].default == ",".join(map(str, D_KS))
    assert params["ns"].default == ",".join(map(str, NS))
