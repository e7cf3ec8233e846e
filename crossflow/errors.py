"""Errors users see.  Every message is one paragraph that says what to change."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


class CrossflowError(Exception):
    """Base class of all errors CrossFlow raises on purpose."""


class ConfigError(CrossflowError):
    """A configuration input is wrong.

    The message names the file, the key path inside it, the offending value and what is
    allowed, e.g. ``a100.yaml: key 'compute.frequency_GHz' = -1.4: must be > 0``.

    One check may find several errors in one input (a file's schema, a study's independent
    parts): the error is the first, and :attr:`more` holds the others (``crossflow check``
    prints each; other commands say how many more there are).
    """

    def __init__(
        self,
        problem: str,
        *,
        file: str | None = None,
        key: str | None = None,
        value: Any = ...,
        allowed: str | None = None,
    ) -> None:
        self.problem = problem
        self.file = file
        self.key = key
        self.value = value
        self.allowed = allowed
        #: further errors found with this one (the message is this one's alone)
        self.more: tuple[ConfigError, ...] = ()
        super().__init__(self._compose())

    @classmethod
    def together(cls, errors: Sequence[ConfigError]) -> ConfigError:
        """The first of ``errors`` with the others (and those found with each), each
        message once, as its :attr:`more`."""
        flat: dict[str, ConfigError] = {}
        for error in errors:
            for one in error.every():
                flat.setdefault(str(one), one.alone())
        first, *rest = flat.values()
        first.more = tuple(rest)
        return first

    def every(self) -> tuple[ConfigError, ...]:
        """This error and those found with it."""
        return (self, *self.more)

    def alone(self) -> ConfigError:
        """A copy of this error without those found with it."""
        return ConfigError(self.problem, file=self.file, key=self.key, value=self.value,
                           allowed=self.allowed)

    def map(self, fn: Callable[[ConfigError], ConfigError]) -> ConfigError:
        """``fn`` (re-keying, naming the file) applied to this error and to each found with
        it, kept together."""
        return ConfigError.together([fn(e.alone()) for e in self.every()])

    def _compose(self) -> str:
        where = self.file or "<input>"
        parts = [where]
        if self.key:
            shown = "" if self.value is ... else f" = {_short(self.value)}"
            parts.append(f"key '{self.key}'{shown}")
        elif self.value is not ...:
            parts.append(f"value {_short(self.value)}")
        text = ": ".join(parts) + f": {self.problem}"
        if self.allowed:
            text += f"; allowed: {self.allowed}"
        return text if text.endswith(".") else text + "."

    def with_file(self, file: str) -> ConfigError:
        """Return the same error attributed to ``file`` (when it was raised without one);
        likewise those found with it."""
        if not self.more:
            return self if self.file else self._in(file)
        return self.map(lambda e: e if e.file else e._in(file))

    def _in(self, file: str) -> ConfigError:
        return ConfigError(self.problem, file=file, key=self.key, value=self.value,
                           allowed=self.allowed)


class InfeasibleDesignError(CrossflowError):
    """A design point cannot run (e.g. memory over capacity, an impossible budget).

    Searches record it as an infeasible trial with this message as the reason.
    ``memory_bytes`` is the memory per device the design would need, when that is the cause.
    """

    def __init__(self, message: str, *, memory_bytes: float | None = None) -> None:
        super().__init__(message)
        self.memory_bytes = memory_bytes


def one_paragraph(text: str) -> str:
    """``text`` as the one line an error is printed as: a character that would break it or
    could not be shown (a newline or tab in a path, a terminal escape, an undecodable byte
    of a command-line argument) is written as its Python escape, as ``repr`` would."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
