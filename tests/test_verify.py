"""The IR verifier accepts what the frontend builds and names the rule each corrupted IR breaks."""
from __future__ import annotations

import re

import pytest

import k31dsl as k
from k31dsl.dsl import dtypes as D
from k31dsl.dsl.errors import K31Error, Loc
from k31dsl.dsl.ir import Block, Op, Param, TensorType, TileType, Value, all_ops
from k31dsl.dsl.verify import RULES, RULES_BY_NAME, problems, verify


@k.kernel
def base(x: k.Tensor[k.f32, "N", "D"], y: k.Tensor[k.f32, "N"], s: k.f32, B: k.constexpr = 8):
    for n in k.grid(x.shape[0]):
        acc = k.zeros((B,), k.f32)
        for j in range(k.cdiv(x.shape[1], B)):
            t = x[n, k.span(j * B, B, other=0.0)]
            acc += k.exp(t) * s
        y[n] = k.sum(acc)


@k.kernel
def two_d(x: k.Tensor[k.f32, "N", "D"], out: k.Tensor[k.i32, "N", "D"], BN: k.constexpr = 4, BD: k.constexpr = 4):
    for i, j in k.grid(k.cdiv(x.shape[0], BN), k.cdiv(x.shape[1], BD)):
        rows = i * BN + k.arange(BN)
        v = k.load(x, (rows, k.span(j * BD, BD)), mask=rows[:, None] < x.shape[0], other=float("-inf"))
        vals, pos = k.topk(v, 2)
        k.store(out, (rows, k.span(j * BD, 2)), pos + k.cumsum(vals, axis=1, reverse=True).to(k.i32),
                mask=rows[:, None] < x.shape[0])


def _find(kern, name, nth=0) -> Op:
    return [op for op in all_ops(kern) if op.name == name][nth]


def _loop(kern) -> Op:
    return _find(kern, "for")


def _loop_body(kern) -> Block:
    return _loop(kern).regions[0]


def _fresh(dtype=D.f32, shape=()):
    return Value(TileType(dtype, shape))


def _param(kern, name) -> Value:
    return next(p.value for p in kern.params if p.name == name)


# ---------------------------------------------------------------- corruptions: (rule, message part, mutate)

def use_before_def(kern):
    body = kern.body.ops
    body.append(body.pop(0))                    # acc's `full` now comes after the loop that reads it


def value_from_inside_a_loop(kern):
    inner_add = [op for op in _loop_body(kern).ops if op.name == "add"][-1]
    _find(kern, "sum").operands[0] = inner_add.result


def never_defined(kern):
    _find(kern, "sum").operands[0] = _fresh(D.f32, (8,))


def wrong_result_type(kern):
    _find(kern, "sum").result.type = TileType(D.f32, (8,))


def operand_dtype_mismatch(kern):
    mul = _find(kern, "mul", 1)                 # exp(t) * s inside the loop
    mul.operands[1] = _loop_body(kern).args[0]  # the i32 induction variable


def missing_yield(kern):
    _loop_body(kern).ops.pop()


def yield_in_body(kern):
    kern.body.ops.append(Op("yield", [], [], {}, [], Loc(kern.loc.file, 99, 4)))


def yield_not_last(kern):
    body = _loop_body(kern)
    body.ops.insert(0, Op("yield", list(body.ops[-1].operands), [], {}, [], body.ops[-1].loc))


def yield_wrong_type(kern):
    body = _loop_body(kern)
    body.ops[-1].operands[0] = body.args[0]


def carried_arg_type(kern):
    _loop_body(kern).args[1].type = TileType(D.f32, (16,))


def two_regions(kern):
    _loop(kern).regions.append(Block([_fresh(D.i32)], []))


def float_op_in_host(kern):
    kern.host.ops.append(Op("exp", [_param(kern, "s")], [_fresh()], {}, [], kern.loc))


def float_arithmetic_in_host(kern):
    s = _param(kern, "s")
    kern.host.ops.append(Op("mul", [s, s], [_fresh()], {}, [], kern.loc))


def store_into_scalar(kern):
    _find(kern, "store").operands[0] = _param(kern, "s")


def store_into_tile(kern):
    _find(kern, "store").operands[0] = _find(kern, "full").result


def tensor_in_arithmetic(kern):
    _find(kern, "exp").operands[0] = _param(kern, "x")


def tensor_result(kern):
    _find(kern, "load").result.type = TensorType(D.f32, ("N",))


def missing_attr(kern):
    del _find(kern, "sum").attrs["axis"]


def attr_of_wrong_kind(kern):
    _find(kern, "full").attrs["dtype"] = "f32"


def bad_index_entry(kern):
    _find(kern, "load").attrs["index"] = ["scalar", "span:0"]


def unknown_index_kind(kern):
    _find(kern, "load").attrs["index"] = ["scalar", "slice"]


def index_operand_count(kern):
    _find(kern, "load").operands.pop()


def defined_twice(kern):
    exp = _find(kern, "exp")
    _find(kern, "full").results[0] = exp.result


def unknown_op(kern):
    _find(kern, "sum").name = "total"


def wrong_arity(kern):
    _find(kern, "full").operands.append(_find(kern, "dim").result)


def four_grid_extents(kern):
    kern.grid = kern.grid * 4
    kern.body.args = [_fresh(D.i32) for _ in range(4)]


def grid_from_body(kern):
    kern.grid = [_find(kern, "dim", 1).result]


def grid_of_floats(kern):
    kern.grid = [_param(kern, "s")]


def body_args_mismatch(kern):
    kern.body.args.append(_fresh(D.i32))


def body_arg_type(kern):
    kern.body.args[0].type = TileType(D.i64, ())


def duplicate_param(kern):
    kern.params.append(Param("x", Value(TensorType(D.f32, ("N",)))))


def fp8_scalar_param(kern):
    kern.params.append(Param("q", Value(TileType(D.f8e4m3, ()))))


CORRUPTIONS = [
    ("dominance", "is used before its definition", use_before_def),
    ("dominance", "is defined in the `for` body", value_from_inside_a_loop),
    ("dominance", "is never defined", never_defined),
    ("type-rules", "is f32[8], the type rule gives f32", wrong_result_type),
    ("type-rules", "dtype mismatch in `mul`", operand_dtype_mismatch),
    ("for-yield", "does not end with `yield`", missing_yield),
    ("yield-placement", "`yield` in the body block", yield_in_body),
    ("yield-placement", "not the last op", yield_not_last),
    ("for-yield", "`yield` gives (i32) but the loop carries (f32[8])", yield_wrong_type),
    ("for-signature", "has type f32[16] but its initial value", carried_arg_type),
    ("regions", "`for` has 2 regions", two_regions),
    ("host-ops", "`exp` in the host block", float_op_in_host),
    ("host-ops", "host `mul` gives f32", float_arithmetic_in_host),
    ("tensor-operands", "`store` stores into %s (f32)", store_into_scalar),
    ("tensor-operands", "`store` stores into %acc (f32[8])", store_into_tile),
    ("tensor-operands", "operand 0 of `exp` is the tensor %x", tensor_in_arithmetic),
    ("tensor-values", "`load` result %t is a tensor", tensor_result),
    ("required-attrs", "`sum` lacks attribute(s) axis", missing_attr),
    ("attr-types", "attribute dtype = 'f32' of `full` must be a dtype", attr_of_wrong_kind),
    ("access-index", "index entry 'span:0'", bad_index_entry),
    ("access-index", "index entry 'slice'", unknown_index_kind),
    ("access-index", "takes 3 operands, got 2", index_operand_count),
    ("defined-once", "is defined 2 times", defined_twice),
    ("known-op", "unknown op `total`", unknown_op),
    ("arity", "`full` takes 0 operand(s), got 1", wrong_arity),
    ("grid", "the grid has 4 extents", four_grid_extents),
    ("grid", "is not computed in the host block", grid_from_body),
    ("grid", "has type f32, not i32", grid_of_floats),
    ("body-args", "2 program ids for 1 grid extents", body_args_mismatch),
    ("body-args", "has type i64, not i32", body_arg_type),
    ("params", "parameter `x` is declared twice", duplicate_param),
    ("params", "`q` has type f8e4m3", fp8_scalar_param),
]


@pytest.mark.parametrize("rule,part,mutate", CORRUPTIONS, ids=[c[2].__name__ for c in CORRUPTIONS])
def test_corrupted_ir_is_rejected_naming_the_rule(rule, part, mutate):
    kern = base.ir()
    verify(kern)
    mutate(kern)
    found = problems(kern)
    assert any(p.rule == rule and part in p.message for p in found), \
        f"expected [{rule}] ...{part}...; got:\n" + "\n".join(map(str, found))
    with pytest.raises(K31Error) as ei:
        verify(kern)
    text = str(ei.value)
    assert f"[{rule}]" in text and part in text
    # each problem line names a location in the kernel's source file
    hit = next(p for p in found if p.rule == rule and part in p.message)
    assert hit.loc.file == base.file and f"{hit.loc}: [{rule}]" in text


def test_every_rule_has_a_corruption_that_breaks_it():
    assert {c[0] for c in CORRUPTIONS} == {r.name for r in RULES}


def test_rules_are_listed_with_names_and_messages():
    names = [r.name for r in RULES]
    assert len(names) == len(set(names)) == len(RULES_BY_NAME)
    for r in RULES:
        assert re.fullmatch(r"[a-z][a-z-]*", r.name) and r.message and callable(r.check)
        assert r.scope in ("op", "kernel") and set(r.needs) <= set(names)
        # a rule only waits on rules that run before it
        assert all(names.index(n) < names.index(r.name) for n in r.needs)


def test_all_problems_are_reported_at_once():
    kern = base.ir()
    missing_attr(kern)
    float_op_in_host(kern)
    yield_in_body(kern)
    rules = {p.rule for p in problems(kern)}
    assert {"required-attrs", "host-ops", "yield-placement"} <= rules
    with pytest.raises(K31Error, match=r"fails IR verification \(3 problems\)"):
        verify(kern)


def test_type_rules_wait_for_well_formed_attributes():
    # a missing attribute is reported once, not again as a crash of the type rule
    kern = base.ir()
    missing_attr(kern)
    assert [p.rule for p in problems(kern)] == ["required-attrs"]


def test_verifier_accepts_frontend_kernels():
    from k31dsl.dsl.parse import parse_kernel
    from k31dsl.dsl.text import print_kernel
    from test_text_form import CASES, KERNELS
    kernels = [base.ir(), base.ir(B=32), two_d.ir(), two_d.ir(BN=2, BD=8)]
    kernels += [KERNELS[name].ir(**cx) for name, cx in CASES]
    for kern in kernels:
        verify(kern)
        verify(parse_kernel(print_kernel(kern)))


def test_verifier_accepts_the_op_library():
    from k31dsl.ops.registry import all_ops as library
    specs = library()
    count = 0
    for spec in specs.values():
        for kdef in spec.kernels:
            for cx in [{}] + [dict(c) for c in kdef.configs]:
                verify(kdef.ir(**cx))
                count += 1
    assert count, "the op library registers no kernels"


def test_loop_stages_hint_must_be_a_positive_int():
    """The `stages` attr of a `for` (k.range's pipelining hint): an integer >= 1, else a problem of
    the attr-types rule (e.g. in a hand-edited .k31 file)."""
    kern = base.ir()
    loop = _loop(kern)
    loop.attrs["stages"] = 2
    assert not problems(kern)
    for bad in (0, -1, 2.5, "3"):
        loop.attrs["stages"] = bad
        assert [p.rule for p in problems(kern)] == ["attr-types"], bad
