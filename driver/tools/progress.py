"""A rich progress bar of work items done and remaining, silent when turned off (`gemforge sweep`'s
points, `gemforge tune`'s trials)."""

from __future__ import annotations

__all__ = ["ProgressBar"]


class ProgressBar:
    """``what`` [bar] done/total, time left, and the description of the last item done."""

    def __init__(self, what: str, total: int, enabled: bool):
        self.what, self.total, self.enabled = what, total, enabled and total > 0
        self._progress = None

    def __enter__(self):
        if self.enabled:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
            self._progress = Progress(TextColumn(self.what), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                                      TextColumn("{task.description}"))
            self._progress.__enter__()
            self._task = self._progress.add_task("", total=self.total)
        return self

    def advance(self, description: str) -> None:
        """One more item done (never past the total: a run may do more than it planned)."""
        if self._progress is not None:
            done = self._progress.tasks[0].completed
            self._progress.update(self._task, completed=min(self.total, done + 1), description=description)

    def __exit__(self, *exc):
        if self._progress is not None:
            self._progress.__exit__(*exc)
