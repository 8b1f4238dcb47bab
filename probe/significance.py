"""The significance level of every test probe reports (verdicts against papers, claims of head
and key/value studies, plan summaries): declared once, read everywhere.

`ALPHA_EXACT` is the same level as a fraction, for p-values computed exactly (counted
permutations), so that no float rounding can move a p-value across it.
"""

from __future__ import annotations

from fractions import Fraction

ALPHA_EXACT = Fraction(1, 20)
ALPHA = float(ALPHA_EXACT)  # 0.05
