import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    """Tests use one torch thread: quicker on a shared 2-core machine, and deterministic."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _skip_reason(report) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:  # (path, line, "Skipped: reason")
        return str(longrepr[2])
    return str(longrepr)


def pytest_terminal_summary(terminalreporter):
    """End the run with what was skipped, grouped by what is missing, and how to install it."""
    from skips import summary

    reports = terminalreporter.stats.get("skipped", [])
    line = summary(_skip_reason(r) for r in reports)
    if line:
        terminalreporter.write_line(line, yellow=True)
