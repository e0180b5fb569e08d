"""A kernel's or @k.func helper's Python source, as the frontend reads it: the `def` node parsed
from the user's file (exact lines and columns, any indentation), `loc(node)` to map an AST node back
to that file for error messages, and the names the function can see. Parsed once per function.
"""
from __future__ import annotations

import ast
import collections
import inspect
import linecache
import textwrap
import weakref

from .errors import K31Error, Loc, error


class PySource:
    """A function's AST with the offsets that map it back to the user's file, and the names it
    can see (closure variables over module globals, both live)."""

    def __init__(self, fn, owner=None):
        self.file = inspect.getsourcefile(fn) or "<unknown>"
        lines, first = inspect.getsourcelines(fn)
        self.fdef, self.first_line, self.col_offset = self._from_file(fn, first), 1, 0
        if self.fdef is None:       # the file no longer parses (edited since import): the block
            raw = "".join(lines)
            dedented = textwrap.dedent(raw)
            self.first_line = first
            self.col_offset = len(raw.splitlines()[0]) - len(dedented.splitlines()[0])
            self.fdef = ast.parse(dedented).body[0]
        if not isinstance(self.fdef, ast.FunctionDef):
            raise error(f"`{fn.__name__}` must be defined with a plain `def`", self.loc(self.fdef),
                        "write `def name(...):` under the decorator (not a lambda or async def)")
        try:
            nonlocals = inspect.getclosurevars(fn).nonlocals
        except (TypeError, ValueError):
            nonlocals = {}
        self.scope = collections.ChainMap(nonlocals, getattr(owner, "def_locals", {}), fn.__globals__)

    def _from_file(self, fn, first: int):
        """The def node found in the parsed file: exact lines and columns, any indentation."""
        try:
            tree = ast.parse("".join(linecache.getlines(self.file)))
        except (SyntaxError, ValueError):
            return None
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == fn.__name__:
                start = min([d.lineno for d in node.decorator_list] + [node.lineno])
                if start == first:
                    return node
        for node in ast.walk(tree):         # a lambda assigned to a name, e.g. f = k.kernel(lambda ...)
            if isinstance(node, ast.Lambda) and node.lineno == first:
                return node
        return None

    def loc(self, node) -> Loc:
        return Loc(self.file, self.first_line + getattr(node, "lineno", 1) - 1,
                   getattr(node, "col_offset", 0) + self.col_offset)


_SOURCE_CACHE: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def source_of(fn, owner=None) -> PySource:
    """The parsed source of fn; `owner` is its KernelDef/FuncDef (for names seen at definition)."""
    if fn not in _SOURCE_CACHE:
        try:
            _SOURCE_CACHE[fn] = PySource(fn, owner)
        except (OSError, TypeError, SyntaxError, IndexError) as e:
            raise K31Error(f"cannot read the source of `{getattr(fn, '__name__', fn)}` ({e})",
                           hint="kernels and @k.func helpers must be defined in a Python file") from None
    return _SOURCE_CACHE[fn]
