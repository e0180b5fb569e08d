"""The one error type users see, and the source locations it carries."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Loc:
    file: str
    line: int
    col: int = 0

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


UNKNOWN = Loc("<unknown>", 0, 0)


class K31Error(Exception):
    """A mistake the user can fix. `str(err)` reads `file:line:col: message` plus a hint line,
    and, when the source is at hand, the offending line with a caret under the column."""

    def __init__(self, message: str, loc: Loc | None = None, hint: str | None = None,
                 source_line: str | None = None):
        self.message = message
        self.loc = loc
        self.hint = hint
        self.source_line = source_line
        super().__init__(self._render())

    def _render(self) -> str:
        head = f"{self.loc}: {self.message}" if self.loc and self.loc.line else self.message
        parts = [head]
        if self.source_line is not None and self.loc is not None:
            parts.append("    " + self.source_line.rstrip())
            parts.append("    " + " " * self.loc.col + "^")
        if self.hint:
            parts.append(f"  hint: {self.hint}")
        return "\n".join(parts)


def source_line_at(loc: Loc | None) -> str | None:
    if loc is None or loc.line <= 0:
        return None
    try:
        import linecache
        text = linecache.getline(loc.file, loc.line)
        return text or None
    except Exception:  # noqa: BLE001 - a missing file only loses the excerpt
        return None


class CapacityError(K31Error):
    """A kernel whose tiles at these constexprs do not fit a target's on-chip memory (e.g. the
    192 KB Unified Buffer of an Ascend vector core): correct code, too large a specialisation."""


def error(message: str, loc: Loc | None = None, hint: str | None = None, kind: type = K31Error) -> K31Error:
    """Build a K31Error (or a subclass such as CapacityError) with the source excerpt filled in."""
    return kind(message, loc, hint, source_line_at(loc))
