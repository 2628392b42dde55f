"""``xbench compare`` and ``xbench check``: two stored runs, case by case.

``runs`` loads a run and checks two runs' metadata; ``verdicts`` tests each case;
``formats`` writes Markdown and JUnit XML.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from xbench.compare.runs import StoredRun, case_frame, differences, load_run
from xbench.compare.verdicts import VERDICTS, Gates, compare_frames
from xbench.errors import XbenchError

# Exit codes of compare and check (documented in the README): 0 nothing regressed.
EXIT_REGRESSION = 1
EXIT_NOT_COMPARABLE = 4


@dataclass
class Comparison:
    baseline: StoredRun
    candidate: StoredRun
    cases: pd.DataFrame
    allowed: list  # (field, baseline, candidate) that differ and were allowed

    @property
    def regressed(self) -> bool:
        return bool((self.cases.verdict == "slower").any())


def compare_runs(baseline, candidate, gates: Gates = Gates(), allow=()) -> Comparison:
    """Compare two run directories; raises (exit code 4) when their metadata differs on a
    field not in ``allow``, naming each such field."""
    base, cand = load_run(baseline), load_run(candidate)
    diffs = differences(base, cand)
    blocking = [d for d in diffs if d[0] not in set(allow)]
    if blocking:
        what = "; ".join(f"{k}: {b!s} vs {c!s}" for k, b, c in blocking)
        raise XbenchError(
            f"runs are not comparable ({what})",
            "compare runs of one setup, or pass --allow "
            + ",".join(k for k, _, _ in blocking)
            + " to compare across that change on purpose",
            exit_code=EXIT_NOT_COMPARABLE,
        )
    cases = compare_frames(case_frame(base), case_frame(cand), gates)
    return Comparison(base, cand, cases, [d for d in diffs if d[0] in set(allow)])


__all__ = [
    "EXIT_NOT_COMPARABLE",
    "EXIT_REGRESSION",
    "VERDICTS",
    "Comparison",
    "Gates",
    "compare_frames",
    "compare_runs",
    "load_run",
]
