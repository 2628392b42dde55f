"""The one exception type the CLI turns into a one-line message and an exit code."""

from __future__ import annotations


class XbenchError(Exception):
    """A problem the user can fix. ``problem`` says what is wrong, ``fix`` what to do."""

    exit_code = 2

    def __init__(self, problem: str, fix: str | None = None, exit_code: int | None = None):
        super().__init__(problem)
        self.problem = problem
        self.fix = fix
        if exit_code is not None:
            self.exit_code = exit_code

    def __str__(self) -> str:
        return f"{self.problem}; {self.fix}" if self.fix else self.problem


class RankFailure(XbenchError):
    """A rank died, hung or reported an error while measuring."""

    exit_code = 3
