"""The progress line of a study run on stderr (docs/architecture.md, Studies)."""

from __future__ import annotations

import sys
import time

from crossflow.outputs import silence
from crossflow.search import keys


class Progress:
    """A one-line progress report on stderr (a bar on a terminal, else every ~10 %): an
    Optuna callback (this process's trials) or :meth:`poll` (all workers' trials).

    Every count is study-wide: finished trials, the best value and the infeasible trials
    include those of earlier launches (counted from ``study`` when the line is made); only
    the rate is this launch's."""

    def __init__(self, name: str, study, total: int, enabled: bool) -> None:
        self.name, self.total, self.enabled = name, total, enabled
        self._count(study)
        self.start_done, self.t0, self.last = self.done, time.perf_counter(), 0.0
        self.tty = enabled and sys.stderr.isatty()
        self.step = max(1, (total - self.done) // 10)
        self.shown = 0        # steps printed (not a terminal)
        self._last_done = self.done
        self.printed = False  # the current count is on the last line (not a terminal)

    def _add(self, trial) -> None:
        if trial.state.name not in ("COMPLETE", "PRUNED"):
            return  # failed (retried), or surplus: not a finished trial
        self.done += 1
        if trial.values is not None:
            if keys.is_feasible(trial):
                if self.best is None or trial.values[0] < self.best:
                    self.best = trial.values[0]
            else:
                self.infeasible += 1

    def _count(self, study) -> None:
        """Every finished trial in the storage (trials of other processes and launches)."""
        from optuna.trial import TrialState

        self.done, self.best, self.infeasible = 0, None, 0
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,
                                                          TrialState.PRUNED)):
            self._add(t)

    def __call__(self, study, trial) -> None:
        self._add(trial)
        self._show()

    def poll(self, study) -> None:
        """Count every finished trial in the storage again, and show the line."""
        self._count(study)
        self._show()

    def _show(self) -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        if self.done != self._last_done:
            self._last_done, self.printed = self.done, False
        steps = (self.done - self.start_done) // self.step
        if self.tty and now - self.last > 0.1:
            self.last = now
            self._print("\r" + self.line(now), end="")
        elif not self.tty and steps > self.shown:
            self.shown = steps
            self.printed = True
            self._print(self.line(now))

    def line(self, now: float) -> str:
        n = self.done - self.start_done
        width = 24
        filled = min(width, int(width * self.done / max(1, self.total)))
        best = "-" if self.best is None else f"{self.best:.6g}"
        rate = n / max(1e-9, now - self.t0)
        return (f"{self.name} [{'#' * filled}{'.' * (width - filled)}] "
                f"{self.done}/{self.total} trials, best {best}, "
                f"{self.infeasible} infeasible, {rate:.1f} trials/s")

    def close(self) -> None:
        if self.enabled and (self.tty or not self.printed):
            self._print(("\r" if self.tty else "") + self.line(time.perf_counter()))

    def _print(self, text: str, end: str = "\n") -> None:
        try:
            print(text, end=end, file=sys.stderr, flush=True)
        except BrokenPipeError:
            # the reader went away (``crossflow study run … 2>&1 | head``): the study goes
            # on to its --trials without its line, and nothing else is written there
            self.enabled = False
            silence(sys.stderr)
