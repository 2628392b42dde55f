"""``xbench compare`` and ``xbench check``: two stored runs, case by case.

``runs`` loads a run and checks two runs' metadata; ``verdicts`` tests each case;
``formats`` writes Markdown and JUnit XML.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from xbench.compare.runs import (
    EXIT_NOT_COMPARABLE,
    StoredRun,
    case_frame,
    differences,
    load_run,
)
from xbench.compare.verdicts import VERDICTS, Gates, compare_frames
from xbench.errors import XbenchError
from xbench.results.store import run_identity

# Exit codes of compare and check (documented in the README): 0 nothing regressed, 1 a case
# is slower, 4 nothing could be compared, 5 the candidate lacks cases of the baseline (or is
# a partial run) and nothing is slower.
EXIT_REGRESSION = 1
EXIT_INCOMPLETE = 5


@dataclass
class Comparison:
    baseline: StoredRun
    candidate: StoredRun
    cases: pd.DataFrame
    allowed: list  # (field, baseline, candidate) that differ and were allowed
    allow_missing: bool = False  # missing cases and a partial candidate do not fail the gate

    @property
    def regressed(self) -> bool:
        return bool((self.cases.verdict == "slower").any())

    @property
    def missing(self) -> list[str]:
        return list(self.cases.case[self.cases.verdict == "missing"])

    @property
    def problems(self) -> list[str]:
        """What makes the candidate fall short of the baseline, one phrase each: the gate
        fails on these unless missing cases were allowed."""
        found = []
        if self.candidate.incomplete:
            found.append(f"the candidate {self.candidate.incomplete}")
        if self.missing:
            shown = ", ".join(self.missing[:3]) + (", ..." if len(self.missing) > 3 else "")
            found.append(
                f"{len(self.missing)} case(s) of the baseline are missing in the candidate "
                f"({shown})"
            )
        if not self.cases.q_value.notna().any():
            found.append("no case could be compared")
        return found

    @property
    def warnings(self) -> list[str]:
        """What the reader should know that fails no gate."""
        found = []
        if self.baseline.incomplete:
            found.append(
                f"the baseline {self.baseline.incomplete}: the cases it lacks are not guarded"
            )
        if self.allow_missing and self.problems:
            found += [f"{p} (allowed by --allow-missing)" for p in self.problems]
        return found

    @property
    def exit_code(self) -> int:
        """0 passed; 1 a case is slower; 4 nothing could be compared; 5 the candidate lacks
        what the baseline has (cases, or a whole finished run)."""
        if self.regressed:
            return EXIT_REGRESSION
        if not self.cases.q_value.notna().any():
            return EXIT_NOT_COMPARABLE
        if self.problems and not self.allow_missing:
            return EXIT_INCOMPLETE
        return 0


def compare_runs(
    baseline, candidate, gates: Gates = Gates(), allow=(), allow_missing: bool = False
) -> Comparison:
    """Compare two run directories (or runs already loaded); raises (exit code 4) when
    they hold one run, are runs of different commands, or their metadata differs on a field
    not in ``allow``, naming each field."""
    base, cand = (r if isinstance(r, StoredRun) else load_run(r) for r in (baseline, candidate))
    same = run_identity(base.path, base.meta)
    if same == run_identity(cand.path, cand.meta):
        # whatever changed since, a run against itself passes the gate: a nightly job whose
        # new run failed to appear must not be told "unchanged"
        raise XbenchError(
            f"{base.path} and {cand.path} are the same {same}: against itself every case is "
            "unchanged or inconclusive",
            "pass the baseline and a run made after it",
            exit_code=EXIT_NOT_COMPARABLE,
        )
    diffs = differences(base, cand)
    blocking = [d for d in diffs if d[0] not in set(allow)]
    if blocking:
        what = "; ".join(f"{k}: {b!s} vs {c!s}" for k, b, c in blocking)
        fields = ",".join(k for k, _, _ in [*blocking, *[d for d in diffs if d[0] in allow]])
        raise XbenchError(
            f"runs are not comparable ({what})",
            f"compare runs of one setup, or pass --allow {fields} to compare across "
            + ("that change" if len(blocking) == 1 else "those changes")
            + " on purpose",
            exit_code=EXIT_NOT_COMPARABLE,
        )
    cases = compare_frames(case_frame(base), case_frame(cand), gates)
    allowed = [d for d in diffs if d[0] in set(allow)]
    return Comparison(base, cand, cases, allowed, allow_missing)


__all__ = [
    "EXIT_INCOMPLETE",
    "EXIT_NOT_COMPARABLE",
    "EXIT_REGRESSION",
    "VERDICTS",
    "Comparison",
    "Gates",
    "compare_frames",
    "compare_runs",
    "load_run",
]
