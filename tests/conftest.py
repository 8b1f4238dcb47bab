import logging
from pathlib import Path

import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    """Tests use one torch thread: quicker on a shared 2-core machine, and deterministic."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def quiet_transformers():
    """transformers' logger at ERROR for the test: it warns about rotary sections it accepts
    anyway (Phi-3's original context, YaRN's factor beside it)."""
    logger = logging.getLogger("transformers")
    level = logger.level
    logger.setLevel(logging.ERROR)
    yield
    logger.setLevel(level)


@pytest.fixture
def plans_only(monkeypatch):
    """Planning a head study reads only its file, so the tests of plans run where the model it
    names is not installed (a bundled model's package is optional): its source goes unchecked."""
    monkeypatch.setattr("probe.study.heads.spec.check_source", lambda source, where: None)


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # (path, line, "Skipped: reason")
        return str(longrepr[2])
    return str(longrepr)


def pytest_addoption(parser):
    parser.addoption(
        "--record-skips",
        metavar="FILE",
        help="write the ids of the skipped tests to FILE, one a line (.ci/run runs them again "
        "once it has installed the optional packages they wait for)",
    )


def pytest_terminal_summary(terminalreporter, config):
    """End the run with what was skipped, grouped by what is missing, and how to install it."""
    from skips import summary

    reports = terminalreporter.stats.get("skipped", [])
    line = summary(_skip_reason(r) for r in reports)
    if line:
        terminalreporter.write_line(line, yellow=True)
    record = config.getoption("--record-skips")
    if record:  # a module skipped whole is its path, which runs it again just as well
        ids = dict.fromkeys(r.nodeid for r in reports)
        Path(record).parent.mkdir(parents=True, exist_ok=True)
        Path(record).write_text("".join(f"{i}\n" for i in ids))
