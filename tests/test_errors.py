"""The error catalogue: each bad kernel is written to a real file, imported, and compiled (or
called); the mistake must come back as a K31Error naming the offending file:line, with a key
phrase and a hint. A fuzz test then mutates a valid kernel and accepts only K31Error or success."""
from __future__ import annotations

import importlib.util
import itertools
import random
import sys
import textwrap
import tokenize
import io

import pytest
import torch

import k31dsl as k
from k31dsl import K31Error

HEADER = "import k31dsl as k\n\n"
_counter = itertools.count()


def load_module(tmp_path, source: str, stem: str = "bad"):
    """Write `source` to a fresh file and import it; returns (module, path, marked line)."""
    text = HEADER + textwrap.dedent(source).lstrip("\n")
    path = tmp_path / f"{stem}_{next(_counter)}.py"
    path.write_text(text)
    name = f"k31_err_{path.stem}_{id(tmp_path)}"
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    marked = [i + 1 for i, line in enumerate(text.splitlines()) if line.rstrip().endswith("# <-")]
    return mod, str(path), (marked[0] if marked else None)


def expect_error(tmp_path, source: str, phrase: str, action=None):
    mod, path, line = load_module(tmp_path, source)
    with pytest.raises(K31Error) as info:
        if action is None:
            mod.kern.ir()
        else:
            action(mod)
    err = info.value
    assert err.loc is not None, str(err)
    assert err.loc.file == path, str(err)
    assert line is not None and err.loc.line == line, f"expected line {line}:\n{err}"
    assert phrase.lower() in str(err).lower(), f"missing {phrase!r} in:\n{err}"
    assert err.hint, f"no hint in:\n{err}"
    assert f"{path}:{line}:" in str(err)
    return err


from error_cases import CASES  # noqa: E402 - the catalogue, kept in its own file


@pytest.mark.parametrize("case", sorted(CASES))
def test_compile_error(tmp_path, case):
    source, phrase = CASES[case]
    expect_error(tmp_path, source, phrase)


# ---------------------------------------------------------------- errors at call time

CALLEE = """
    @k.kernel
    def kern(x: k.Tensor[k.f32, "N", "D"],  # <-
             y: k.Tensor[k.f32, "N", "D // 2"], a: k.f32, BD: k.constexpr = 16):
        for i in k.grid(x.shape[0]):
            y[i, k.span(0, BD // 2)] = x[i, k.span(0, BD // 2)] * a
    """


def _call_case(tmp_path, args, phrase, line_offset=0, **kw):
    mod, path, line = load_module(tmp_path, CALLEE)
    with pytest.raises(K31Error) as info:
        mod.kern["numpy"](*args, **kw)
    err = info.value
    assert err.loc is not None and err.loc.file == path, str(err)
    assert err.loc.line == line + line_offset, str(err)
    assert phrase.lower() in str(err).lower(), str(err)
    assert err.hint, str(err)


def test_call_wrong_dtype(tmp_path):
    x = torch.zeros(4, 16, dtype=torch.bfloat16)
    _call_case(tmp_path, (x, torch.zeros(4, 8), 1.0), "`x` of `kern` has dtype bf16, the kernel expects f32")


def test_call_wrong_rank(tmp_path):
    _call_case(tmp_path, (torch.zeros(4, 16), torch.zeros(32), 1.0), "has rank 1", line_offset=1)


def test_call_named_dim_mismatch(tmp_path):
    _call_case(tmp_path, (torch.zeros(4, 16), torch.zeros(5, 8), 1.0), "size 5 on axis 0", line_offset=1)


def test_call_dim_expression_mismatch(tmp_path):
    _call_case(tmp_path, (torch.zeros(4, 16), torch.zeros(4, 9), 1.0), "D // 2 = 8", line_offset=1)


def test_call_wrong_arg_count(tmp_path):
    _call_case(tmp_path, (torch.zeros(4, 16), torch.zeros(4, 8)), "takes 3 arguments")


def test_call_scalar_not_a_number(tmp_path):
    _call_case(tmp_path, (torch.zeros(4, 16), torch.zeros(4, 8), "x"), "must be a number", line_offset=1)


def test_call_unknown_constexpr(tmp_path):
    _call_case(tmp_path, (torch.zeros(4, 16), torch.zeros(4, 8), 1.0), "no parameter BX", BX=3)


@pytest.mark.parametrize("target", ["numpy", "triton"])
def test_checked_signature_still_range_checks_ints(tmp_path, target):
    """After a good call has cached its signature, an int argument that does not fit is still
    rejected (the fast path keys integers by sign and width, not only by type)."""
    mod, _, _ = load_module(tmp_path, """
    @k.kernel
    def kern(x: k.Tensor[k.f32, "N"], n: k.i32):
        for i in k.grid(1):
            x[k.span(0, 16)] = x[k.span(0, 16)] + n.to(k.f32)
    """)
    x = torch.zeros(16)
    mod.kern[target](x, 3)
    assert torch.equal(x, torch.full((16,), 3.0))
    with pytest.raises(K31Error, match="does not fit i32"):
        mod.kern[target](x, 1 << 40)
    assert torch.equal(x, torch.full((16,), 3.0))


def test_ir_unknown_constexpr(tmp_path):
    mod, path, line = load_module(tmp_path, CALLEE)
    with pytest.raises(K31Error, match="no constexpr named BX") as info:
        mod.kern.ir(BX=32)
    assert info.value.loc.file == path and info.value.hint


def test_failed_call_writes_nothing(tmp_path):
    """A call rejected for its last argument leaves every output untouched."""
    mod, _, _ = load_module(tmp_path, CALLEE)
    y = torch.full((4, 8), 7.0)
    with pytest.raises(K31Error):
        mod.kern["numpy"](torch.ones(4, 16), y, "not a number")
    assert torch.all(y == 7.0)


# ---------------------------------------------------------------- fuzz: mutated valid kernels

VALID = '''
from __future__ import annotations
import k31dsl as k

@k.func
def scaled(t, s=2.0):
    return t * s, k.sum(t)

@k.kernel
def kern(x: k.Tensor[k.f32, "N", "D"], y: k.Tensor[k.f32, "N", "D"], w: k.Tensor[k.i32, "N"],
         a: k.f32, BD: k.constexpr = 16):
    for n in k.grid(x.shape[0]):
        acc = k.zeros((BD,), k.f32)
        for j in range(k.cdiv(x.shape[1], BD)):
            t = x[n, k.span(j * BD, BD, other=0.0)]
            u, tot = scaled(t, a)
            acc = k.maximum(acc, u) + tot * 0.5
            y[n, k.span(j * BD, BD)] = k.where(t > 0.0, k.exp2(u), -t)
        w[n] = k.sum((acc > 1.0).to(k.i32))
'''

VALID_ATTENTION = '''
from __future__ import annotations
import k31dsl as k

NEG = float("-inf")

@k.func
def softmax_step(s, m, l, acc, v):
    m_new = k.maximum(m, k.max(s, axis=1))
    p = k.exp(s - m_new[:, None])
    alpha = k.exp(m - m_new)
    return m_new, l * alpha + k.sum(p, axis=1), acc * alpha[:, None] + k.dot(p, v)

@k.kernel
def kern(q: k.Tensor[k.f32, "M", "D"], kv: k.Tensor[k.f32, "N", "D"], o: k.Tensor[k.f32, "M", "D"],
         top: k.Tensor[k.i32, "M", "K"], scale: k.f32, BM: k.constexpr = 16, BN: k.constexpr = 16,
         BD: k.constexpr = 32, K: k.constexpr = 16):
    for i in k.grid(k.cdiv(q.shape[0], BM)):
        M, D = q.shape
        qi = q[k.span(i * BM, BM, other=0.0), k.span(0, BD, other=0.0)]
        m = k.full((BM,), -1e30, k.f32)
        l = k.zeros((BM,), k.f32)
        acc = k.zeros((BM, BD), k.f32)
        best = k.full((BM, K), NEG, k.f32)
        for j in range(k.cdiv(kv.shape[0], BN)):
            cols = j * BN + k.arange(BN)
            kj = kv[k.span(j * BN, BN, other=0.0), k.span(0, BD, other=0.0)]
            s = k.where(cols[None, :] < kv.shape[0], k.dot(qi, kj.T) * scale, NEG)
            m, l, acc = softmax_step(s, m, l, acc, kj)
            for h in k.static_range(2):
                acc = acc + 0.0 * h
        o[k.span(i * BM, BM), k.span(0, BD)] = acc / l[:, None]
        vals, pos = k.topk(k.sum(qi * qi, axis=1)[None, :], 1)
        top[k.span(i * BM, BM), k.span(0, K)] = k.broadcast_to(pos, (BM, K)) + (i * 0)
'''

NAMES = ["x", "y", "w", "t", "n", "j", "acc", "u", "tot", "a", "BD", "k", "scaled", "range",
         "None", "True", "undefined", "f32", "i32", "bf16", "exp2", "span", "grid", "sum", "dot",
         "T", "shape", "to", "other", "axis", "cat", "topk"]
NUMBERS = ["0", "1", "2", "16", "17", "0.5", "3.0", "1e30", "40", "100"]
OPS = {"+": "-*/%", "-": "+*/", "*": "+-/@", "/": "*//%", "//": "/%*", ">": "<==!=>=",
       ",": ",", "(": "(", ")": ")", "[": "[", "]": "]", "=": "=", ".": "."}


def mutants(n: int, seed: int, valid: str = VALID):
    """Mostly well-formed variants: a token replaced by one of its kind, or a line dropped,
    duplicated or swapped with its neighbour (so most mutants get past Python's parser)."""
    lines = valid.splitlines(keepends=True)
    first_body = next(i for i, line in enumerate(lines) if line.startswith("@k."))
    toks = [t for t in tokenize.generate_tokens(io.StringIO(valid).readline)
            if t.start[0] - 1 > first_body and t.type in (tokenize.NAME, tokenize.OP, tokenize.NUMBER)]
    body_lines = [i for i in range(first_body + 2, len(lines))
                  if lines[i].strip() and not lines[i].lstrip().startswith(("def ", "@", "a:"))]
    rng = random.Random(seed)
    for _ in range(n):
        new = list(lines)
        kind = rng.random()
        if kind < 0.7:
            t = rng.choice(toks)
            row, c0, c1 = t.start[0] - 1, t.start[1], t.end[1]
            if t.type == tokenize.NUMBER:
                rep = rng.choice(NUMBERS)
            elif t.type == tokenize.NAME:
                rep = rng.choice(NAMES)
            else:
                rep = rng.choice(list(OPS.get(t.string, "+")) + ["", "//", "**", "==", "&"])
            new[row] = new[row][:c0] + rep + new[row][c1:]
        else:
            i = rng.choice(body_lines)
            if kind < 0.8:
                new[i] = new[i][:len(new[i]) - len(new[i].lstrip())] + "pass\n"
            elif kind < 0.9:
                new.insert(i, new[i])
            elif i + 1 < len(new):
                new[i], new[i + 1] = new[i + 1], new[i]
        yield "".join(new)


FUZZ_BASES = {
    "rowwise": (VALID, lambda: (torch.randn(3, 40), torch.zeros(3, 40), torch.zeros(3, dtype=torch.int32), 0.5)),
    "attention": (VALID_ATTENTION, lambda: (torch.randn(20, 24), torch.randn(37, 24), torch.zeros(20, 24),
                                            torch.zeros(20, 16, dtype=torch.int32), 0.3)),
}


@pytest.mark.parametrize("base", sorted(FUZZ_BASES))
def test_mutated_kernels_fail_only_with_k31error(tmp_path, base):
    valid, make_args = FUZZ_BASES[base]
    ran = compiled_errors = 0
    for i, src in enumerate(mutants(50, seed=31, valid=valid)):
        path = tmp_path / f"mutant_{base}_{i}.py"
        path.write_text(src)
        try:
            compile(src, str(path), "exec")
            spec = importlib.util.spec_from_file_location(f"k31_mutant_{base}_{i}_{id(tmp_path)}", path)
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            kern = mod.kern
        except Exception:  # noqa: BLE001 - not valid Python or fails at import: not our concern
            continue
        if not isinstance(kern, k.KernelDef):
            continue
        try:
            kern["numpy"](*make_args())
            ran += 1
        except K31Error as e:
            assert "internal compiler error" not in str(e), f"mutant {i}:\n{src}\n{e}"
            assert e.loc is not None and e.loc.line > 0, f"mutant {i}: error without a location:\n{e}"
            assert e.hint, f"mutant {i}: error without a hint:\n{e}"
            compiled_errors += 1
        except Exception as e:  # noqa: BLE001
            pytest.fail(f"mutant {i} raised {type(e).__name__}: {e}\n{src}")
    assert compiled_errors >= 10 and ran >= 1, (compiled_errors, ran)


# ---------------------------------------------------------------- portability (compiled targets)

PORTABILITY = {
    "non_power_of_two_tile": ("""
        @k.kernel
        def kern(x: k.Tensor[k.f32, "N"], y: k.Tensor[k.f32, "N"]):
            for i in k.grid(1):
                y[k.span(0, 20)] = x[k.span(0, 20)] * 2.0  # <-
        """, "20 is not a power of two"),
    "small_dot": ("""
        @k.kernel
        def kern(x: k.Tensor[k.f32, "N", "M"], y: k.Tensor[k.f32, "N", "M"]):
            for i in k.grid(1):
                a = x[k.span(0, 8), k.span(0, 16)]
                y[k.span(0, 8), k.span(0, 8)] = k.dot(a, a.T)  # <-
        """, "every dim >= 16"),
}


@pytest.mark.parametrize("case", sorted(PORTABILITY))
def test_compiled_targets_reject_unportable_tiles(tmp_path, case):
    """The numpy reference runs any tile shape; compiled targets report the op's line."""
    source, phrase = PORTABILITY[case]
    x, y = torch.randn(16, 16), torch.zeros(16, 16)
    if case == "non_power_of_two_tile":
        x, y = torch.randn(24), torch.zeros(24)
    mod, path, line = load_module(tmp_path, source)
    mod.kern["numpy"](x, y)
    assert y.abs().sum() > 0
    from k31dsl.dsl.frontend import check_portable
    with pytest.raises(K31Error) as info:
        check_portable(mod.kern.ir())
    err = info.value
    assert err.loc.file == path and err.loc.line == line and phrase in str(err) and err.hint
    y2 = y.clone().zero_()
    with pytest.raises(K31Error, match=phrase):
        mod.kern["triton"](x, y2)
    assert not y2.any()
