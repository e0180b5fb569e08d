"""Operators of the AST frontend (a mixin of `frontend.Frontend`): arithmetic
(`+ - * / // % ** & | ^ << >>`), comparisons, unary `- + ~ not` and `and`/`or`.

On two compile-time operands an operator folds in Python, with guards against runaway sizes; with a
tile or scalar among them it checks the operands, converts an integer scalar that meets a float, and
emits IR ops (`**` by a constant exponent multiplies out or becomes sqrt/rsqrt/exp2). `binary` is
also how builtins_impl builds its elementwise calls.
"""
from __future__ import annotations

import ast
import operator

from . import dtypes as D
from .frontend_exprs import is_const, is_tensor, is_tile, is_value

BINOPS = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.Div: "div", ast.FloorDiv: "floordiv",
          ast.Mod: "mod", ast.BitAnd: "and", ast.BitOr: "or", ast.BitXor: "xor",
          ast.LShift: "shl", ast.RShift: "shr"}
SYMBOL = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%",
          ast.BitAnd: "&", ast.BitOr: "|", ast.BitXor: "^", ast.LShift: "<<", ast.RShift: ">>",
          ast.Pow: "**", ast.MatMult: "@"}
PYFOLD = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
          ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
          ast.BitAnd: operator.and_, ast.BitOr: operator.or_, ast.BitXor: operator.xor,
          ast.LShift: operator.lshift, ast.RShift: operator.rshift, ast.Pow: operator.pow}
CMPOPS = {ast.Lt: "lt", ast.LtE: "le", ast.Gt: "gt", ast.GtE: "ge", ast.Eq: "eq", ast.NotEq: "ne"}
CMPFOLD = {ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge,
           ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Is: operator.is_,
           ast.IsNot: operator.is_not, ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b}
INT_LIMIT = 1 << 64          # compile-time integers stay machine-sized
SEQ_LIMIT = 4096             # longest compile-time tuple/str a kernel may build


class OperatorMixin:
    """Operator handlers; `Frontend` supplies err/emit1 and ExprMixin's expr/describe/as_value/operand."""

    # ------------------------------------------------------------ `and`/`or`, unary operators
    def expr_BoolOp(self, node):
        vals = [self.expr(v) for v in node.values]
        if any(is_value(v) for v in vals):
            raise self.err(node, "`and`/`or` need compile-time operands",
                           "combine masks with & and |, in parentheses: (a < b) & (c < d)")
        out = vals[0]
        for v in vals[1:]:
            out = (out and v) if isinstance(node.op, ast.And) else (out or v)
        return out

    def expr_UnaryOp(self, node):
        x = self.expr(node.operand)
        if not is_value(x):
            f = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Not: operator.not_,
                 ast.Invert: operator.invert}[type(node.op)]
            try:
                return f(x)
            except TypeError:
                raise self.err(node, f"cannot apply this unary operator to {self.describe(x)}",
                               "unary operators apply to numbers and tiles") from None
        x = self.operand(x, node)
        if isinstance(node.op, ast.USub):
            return self.emit1("neg", [x], {}, node)
        if isinstance(node.op, ast.UAdd):
            return x
        if isinstance(node.op, ast.Invert):
            return self.emit1("not", [x], {}, node)
        raise self.err(node, "`not` needs a compile-time operand", "use ~mask for bool tiles")

    # ------------------------------------------------------------ arithmetic
    def expr_BinOp(self, node):
        return self.binop(type(node.op), self.expr(node.left), self.expr(node.right), node)

    def binop(self, optype, a, b, node):
        sym = SYMBOL.get(optype, type(optype).__name__)
        if optype is ast.MatMult:
            raise self.err(node, "`@` is not supported", "use k.dot(a, b) for tile matrix products")
        if not is_value(a) and not is_value(b):
            return self.fold(optype, a, b, node)
        if optype is ast.Pow:
            self.check_arith_operands(a, b, node, sym)
            return self.power(a, b, node)
        return self.binary(BINOPS[optype], a, b, node, sym)

    def fold(self, optype, a, b, node):
        """Evaluate an operator on compile-time operands, with guards against runaway sizes."""
        f = PYFOLD.get(optype)
        if f is None:
            raise self.err(node, f"operator `{SYMBOL.get(optype, '?')}` is not supported",
                           "kernels use + - * / // % ** & | ^ << >> on numbers")
        if optype in (ast.Pow, ast.LShift) and isinstance(b, int) and not isinstance(b, bool) and b > 256:
            raise self.err(node, f"the constant expression grows too large (exponent/shift {b})",
                           "compile-time integers must stay machine-sized")
        if optype is ast.Mult and (isinstance(a, (str, tuple)) or isinstance(b, (str, tuple))):
            n = b if isinstance(a, (str, tuple)) else a
            if isinstance(n, int) and n > SEQ_LIMIT:
                raise self.err(node, f"repeating a sequence {n} times is too large", "keep tuples short")
        try:
            out = f(a, b)
        except Exception as e:  # noqa: BLE001 - the user's constant expression failed
            raise self.err(node, f"cannot evaluate this constant expression: {e}",
                           "both operands are compile-time values here; check their types") from None
        if isinstance(out, int) and not isinstance(out, bool) and abs(out) >= INT_LIMIT:
            raise self.err(node, f"the constant {out} is too large for a kernel",
                           "compile-time integers must fit 64 bits")
        if isinstance(out, (str, tuple)) and len(out) > SEQ_LIMIT:
            raise self.err(node, "the constant sequence is too long", "keep tuples short")
        return out

    def promote_int_scalar(self, a, b, node):
        """An integer scalar (a shape, loop index, program id, int parameter) meeting a float
        operand converts to that float type, as a Python int would; tiles never convert."""
        def float_of(x):
            if is_tile(x):
                return x.type.dtype if x.type.dtype.is_float else None
            return D.f32 if isinstance(x, float) else None

        def int_scalar(x):
            return is_tile(x) and x.type.is_scalar and x.type.dtype.is_int

        if int_scalar(a) and float_of(b) is not None:
            a = self.emit1("cast", [a], {"dtype": float_of(b)}, node)
        elif int_scalar(b) and float_of(a) is not None:
            b = self.emit1("cast", [b], {"dtype": float_of(a)}, node)
        return a, b

    def check_arith_operands(self, a, b, node, sym):
        """Operators take tiles, scalars and numbers; tensor parameters and other values are errors."""
        for x in (a, b):
            if is_tensor(x):
                raise self.err(node, f"`{sym}` on the tensor parameter `{x.hint}`", self.tensor_hint(x))
            if not (is_tile(x) or is_const(x)):
                raise self.err(node, f"cannot compute `{sym}` with {self.describe(x)}",
                               "arithmetic takes tiles, scalars and numbers")

    def binary(self, name, a, b, node, sym=None):
        sym = sym or name
        self.check_arith_operands(a, b, node, sym)
        a, b = self.promote_int_scalar(a, b, node)
        like = a.type.dtype if is_tile(a) else b.type.dtype
        if name == "div" and like.is_int:
            raise self.err(node, "`/` on integers", "use // for integer division (truncates toward "
                           "zero), or cast first with .to(k.f32)")
        a, b = self.as_value(a, node, like), self.as_value(b, node, like)
        return self.emit1(name, [a, b], {}, node)

    def power(self, a, b, node):
        """`**` with a compile-time exponent: small integers multiply out, 0.5/-0.5 are
        sqrt/rsqrt, other exponents use exp2(b * log2(a)) (floats, a > 0). `2 ** t` is exp2(t)."""
        if is_value(b):
            if isinstance(a, (int, float)) and a == 2 and b.type.dtype.is_float:
                return self.emit1("exp2", [b], {}, node)
            raise self.err(node, "`**` needs a compile-time exponent",
                           "for a runtime exponent write k.exp2(b * k.log2(a))")
        if isinstance(b, bool) or not isinstance(b, (int, float)):
            raise self.err(node, f"`**` exponent must be a number, got {self.describe(b)}",
                           "use a literal or a constexpr exponent")
        x = a
        if isinstance(b, int) and 0 <= b <= 16:
            if b == 0:
                return self.emit1("full", [], {"shape": list(x.type.shape), "dtype": x.type.dtype,
                                               "value": 1.0 if x.type.dtype.is_float else 1}, node)
            out = x
            for _ in range(b - 1):
                out = self.emit1("mul", [out, x], {}, node)
            return out
        if not x.type.dtype.is_float:
            raise self.err(node, f"`{x.type.dtype.name} ** {b}`: integer tiles take small non-negative "
                           "integer exponents only", "cast to a float type first with .to(k.f32)")
        if b == 0.5:
            return self.emit1("sqrt", [x], {}, node)
        if b == -0.5:
            return self.emit1("rsqrt", [x], {}, node)
        if isinstance(b, int) and -16 <= b < 0:
            return self.binary("div", 1.0, self.power(x, -b, node), node, "**")
        lg = self.emit1("log2", [x], {}, node)
        return self.emit1("exp2", [self.binary("mul", lg, float(b), node, "**")], {}, node)

    def expr_Compare(self, node):
        if len(node.ops) != 1:
            raise self.err(node, "chained comparisons are not supported", "write (a < b) & (b < c)")
        a, b = self.expr(node.left), self.expr(node.comparators[0])
        op = type(node.ops[0])
        if not is_value(a) and not is_value(b):
            try:
                return CMPFOLD[op](a, b)
            except TypeError as e:
                raise self.err(node, f"cannot compare these compile-time values: {e}",
                               "compare numbers with numbers") from None
        if op not in CMPOPS:
            raise self.err(node, "`is`/`in` need compile-time operands",
                           "compare tiles with ==, !=, <, <=, >, >=")
        return self.binary(CMPOPS[op], a, b, node, {"lt": "<", "le": "<=", "gt": ">", "ge": ">=",
                                                     "eq": "==", "ne": "!="}[CMPOPS[op]])
