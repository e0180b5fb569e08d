"""Parser of the `.k31` text form (grammar.lark) back into kernel IR.

`parse_kernel(text)` rebuilds Values, Ops, blocks and locations exactly as printed, so that
print(parse(print(ir))) == print(ir). It checks only what the text itself must get right (syntax,
names defined once and referenced when defined somewhere, known dtypes, one type per result);
whether the IR makes sense (scoping, op types, host rules, ...) is the verifier's job, run it next.

Names: `%acc.2` gives a Value with hint "acc" (the printer re-derives the `.2`), `%7` a Value
without a hint. Locations `@line:col` take the file from the kernel header, `@"file":line:col`
name their own (ops inlined from a `@k.func` in another file).
"""
from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any

from lark import Lark, Token, Tree
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken

from . import dtypes as D
from .errors import K31Error, Loc
from .ir import Block, Kernel, Op, Param, TensorType, TileType, Value
from .lang import ALIGNMENTS

WORDS = {"none": None, "true": True, "false": False, "inf": math.inf, "nan": math.nan}

# How a terminal is described in "expected ..." messages; anonymous ones show their text.
TERMINAL_WORDS = {"NAME": "a name", "VALUE_NAME": "a value name such as %x", "INT": "an integer",
                  "FLOAT": "a float", "STRING": "a quoted string", "$END": "the end of the text"}


@functools.lru_cache(maxsize=1)
def _parser() -> Lark:
    grammar = (Path(__file__).parent / "grammar.lark").read_text()
    return Lark(grammar, parser="lalr", lexer="contextual", maybe_placeholders=True)


# ---------------------------------------------------------------- errors

class _Text:
    """The source being parsed: file name for locations, lines for the caret excerpt."""

    def __init__(self, text: str, filename: str):
        self.filename = filename
        self.lines = text.splitlines()

    def line(self, n: int) -> str | None:
        return self.lines[n - 1] if 1 <= n <= len(self.lines) else None

    def error(self, message: str, line: int, column: int, hint: str | None = None) -> K31Error:
        # lark columns are 1-based; Loc columns are 0-based like the Python frontend's
        return K31Error(message, Loc(self.filename, line, max(column - 1, 0)), hint, self.line(line))

    def error_at(self, tok: Token, message: str, hint: str | None = None) -> K31Error:
        return self.error(message, tok.line, tok.column, hint)


def _describe_terminals(names) -> str:
    parser = _parser()
    words = []
    for n in sorted(set(names)):
        if n in TERMINAL_WORDS:
            words.append(TERMINAL_WORDS[n])
            continue
        try:
            pat = parser.get_terminal(n).pattern
            words.append(f"`{pat.value}`" if pat.type == "str" else n)
        except KeyError:
            words.append(n)
    words = sorted(set(words))
    if not words:
        return "nothing more"
    return words[0] if len(words) == 1 else "one of " + ", ".join(words)


def _syntax_error(src: _Text, e: UnexpectedInput) -> K31Error:
    if isinstance(e, UnexpectedCharacters):
        ch = src.line(e.line)[e.column - 1] if src.line(e.line) and e.column <= len(src.line(e.line)) else "?"
        return src.error(f"syntax error: unexpected character {ch!r}; expected "
                         f"{_describe_terminals(e.allowed or [])}", e.line, e.column)
    if isinstance(e, UnexpectedToken) and e.token.type != "$END":
        return src.error(f"syntax error: unexpected {e.token.value!r}; expected "
                         f"{_describe_terminals(e.accepts or e.expected)}", e.token.line, e.token.column)
    expected = getattr(e, "expected", None) or getattr(e, "accepts", None) or []
    last = len(src.lines) or 1
    return src.error(f"syntax error: the text ends early; expected {_describe_terminals(expected)}",
                     last, len(src.line(last) or "") + 1)


# ---------------------------------------------------------------- literal helpers

def _unquote(src: _Text, tok: Token) -> str:
    body, out, i = tok.value[1:-1], [], 0
    escapes = {"\\": "\\", '"': '"', "n": "\n", "t": "\t", "r": "\r"}
    while i < len(body):
        c = body[i]
        if c == "\\":
            nxt = body[i + 1]
            if nxt not in escapes:
                raise src.error_at(tok, f"unknown escape \\{nxt} in a string", "use \\\\, \\\", \\n, \\t or \\r")
            out.append(escapes[nxt])
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _value_hint(name: str) -> str | None:
    """`%acc.2` -> "acc", `%7` -> None: the hint the printer turns back into the same name."""
    base = name[1:].split(".")[0]
    return None if base.isdigit() else base


class _Builder:
    def __init__(self, src: _Text):
        self.src = src
        self.file = src.filename
        self.values: dict[str, Value] = {}
        self.def_tok: dict[str, Token] = {}
        self.pending: list[tuple[list, int, Token]] = []   # (list to patch, slot, name token)

    # ------------------------------------------------------------ names
    def define(self, tok: Token, type_) -> Value:
        name = str(tok)
        if name in self.values:
            first = self.def_tok[name]
            raise self.src.error_at(tok, f"{name} is defined twice (first at line {first.line}:{first.column - 1})",
                                    "every value name is defined exactly once; rename one of them")
        v = Value(type_, _value_hint(name))
        self.values[name], self.def_tok[name] = v, tok
        return v

    def refer(self, toks) -> list:
        """Placeholders for operand names; patched once every definition has been seen, so that a
        use before its definition reaches the verifier (which says so) instead of failing here."""
        out: list = [None] * len(toks)
        for i, t in enumerate(toks):
            self.pending.append((out, i, t))
        return out

    def resolve(self):
        for lst, i, tok in self.pending:
            v = self.values.get(str(tok))
            if v is None:
                raise self.src.error_at(tok, f"{tok} is not defined anywhere in this kernel",
                                        "define it with `%name = op(...)` or as a param or block argument")
            lst[i] = v

    # ------------------------------------------------------------ literals and types
    def dtype(self, tok: Token) -> D.DType:
        d = D.BY_NAME.get(str(tok))
        if d is None:
            raise self.src.error_at(tok, f"unknown dtype `{tok}`", f"dtypes are {', '.join(D.BY_NAME)}")
        return d

    def type(self, t: Tree):
        if t.data == "scalar_type":
            return TileType(self.dtype(t.children[0]), ())
        if t.data == "tile_type":
            return TileType(self.dtype(t.children[0]), tuple(int(c) for c in t.children[1:]))
        align = t.children[-1]                 # the `align N` suffix's INT, or None
        dims = tuple(_unquote(self.src, c) for c in t.children[1:-1] if c is not None)
        return TensorType(self.dtype(t.children[0]), dims, self.alignment(align) if align is not None else 0)

    def alignment(self, tok: Token) -> int:
        if int(tok) not in ALIGNMENTS:
            raise self.src.error_at(tok, f"`align {tok}` is no alignment a tensor can promise",
                                    f"bytes out of {', '.join(map(str, ALIGNMENTS))}")
        return int(tok)

    def attr_value(self, t: Tree) -> Any:
        kind = t.data
        if kind == "list_value":
            return [self.attr_value(c) for c in t.children if c is not None]
        tok = t.children[0]
        if kind == "int_value":
            return int(tok)
        if kind == "float_value":
            return float(tok)
        if kind == "string_value":
            return _unquote(self.src, tok)
        word = str(tok)
        if word in WORDS:
            return WORDS[word]
        if word in D.BY_NAME:
            return D.BY_NAME[word]
        raise self.src.error_at(tok, f"unknown attribute value `{word}`",
                                "attribute values are numbers, quoted strings, lists, true/false/none, "
                                "inf/-inf/nan or dtype names")

    def loc(self, t: Tree) -> Loc:
        if t.data == "loc_file":
            f, line, col = t.children
            return Loc(_unquote(self.src, f), int(line), int(col))
        line, col = t.children
        return Loc(self.file, int(line), int(col))

    # ------------------------------------------------------------ structure
    def block_args(self, t: Tree | None) -> list[Value]:
        if t is None:
            return []
        return [self.define(a.children[0], self.type(a.children[1])) for a in t.children]

    def ops(self, trees) -> list[Op]:
        return [self.op(t) for t in trees]

    def op(self, t: Tree) -> Op:
        results_t, name, refs_t, attrs_t, types_t, loc_t, regions_t = t.children
        res_toks = list(results_t.children) if results_t is not None else []
        types = [self.type(c) for c in types_t.children] if types_t is not None else []
        if len(types) != len(res_toks):
            anchor = res_toks[0] if res_toks else name
            raise self.src.error_at(anchor, f"`{name}` has {len(res_toks)} result name(s) but "
                                    f"{len(types)} result type(s)",
                                    "write one type per result after the colon: `%a, %b = op(...) : f32, i32`")
        results = [self.define(tok, ty) for tok, ty in zip(res_toks, types)]
        operands = self.refer(list(refs_t.children) if refs_t is not None else [])
        attrs: dict[str, Any] = {}
        if attrs_t is not None:
            for a in attrs_t.children:
                if a is None:
                    continue
                key, val = a.children
                if str(key) in attrs:
                    raise self.src.error_at(key, f"attribute `{key}` given twice")
                attrs[str(key)] = self.attr_value(val)
        regions = []
        if regions_t is not None:
            for r in regions_t.children:
                args = self.block_args(r.children[0])
                regions.append(Block(args, self.ops(r.children[1:])))
        return Op(str(name), operands, results, attrs, regions, self.loc(loc_t))

    def kernel(self, t: Tree) -> Kernel:
        name, file_tok, line, col, *rest = t.children
        self.file = _unquote(self.src, file_tok)
        kloc = Loc(self.file, int(line), int(col))
        constexprs: dict[str, Any] = {}
        params: list[Param] = []
        host = grid_t = None
        for c in rest:
            if c.data == "constexpr":
                cname, val = c.children
                if str(cname) in constexprs:
                    raise self.src.error_at(cname, f"constexpr `{cname}` given twice")
                constexprs[str(cname)] = self.attr_value(val)
            elif c.data == "param":
                tok, ty = c.children
                params.append(Param(str(tok)[1:], self.define(tok, self.type(ty))))
            elif c.data == "host":
                host = Block([], self.ops(c.children))
            elif c.data == "grid":
                grid_t = c
        refs_t, args_t, *body_ops = grid_t.children
        grid = self.refer(list(refs_t.children) if refs_t is not None else [])
        body = Block(self.block_args(args_t), self.ops(body_ops))
        self.resolve()
        return Kernel(str(name), params, constexprs, host, grid, body, kloc, [])


def parse_kernel(text: str, filename: str = "<k31>") -> Kernel:
    """Parse one kernel in the `.k31` text form. Raises K31Error naming `filename:line:col`."""
    src = _Text(text, filename)
    try:
        tree = _parser().parse(text)
    except UnexpectedInput as e:
        raise _syntax_error(src, e) from None
    return _Builder(src).kernel(tree.children[0])


def parse_file(path) -> Kernel:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise K31Error(f"cannot read {path}: {e.strerror}") from None
    return parse_kernel(text, str(path))


__all__ = ["parse_kernel", "parse_file"]
