"""The first .entry of a PTX module as a list of instructions with their labels."""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from .values import Unsupported


@dataclass
class Instr:
    op: str                      # e.g. "setp.eq.f32"
    args: list[str]
    pred: str | None = None      # "@%p1" guard register, "!" prefix when negated
    line: int = 0

    @property
    def parts(self) -> list[str]:
        return self.op.split(".")


@dataclass
class Entry:
    name: str
    params: list[tuple[str, str]]          # (name, type)
    body: list[Instr]
    labels: dict[str, int]
    threads: int


def _split_args(text: str) -> list[str]:
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


def parse(ptx: str) -> Entry:
    """The first `.entry` of a PTX module: its parameters and instruction list."""
    text = re.sub(r"//[^\n]*", "", ptx)
    text = re.sub(r"(?m)^\s*\.(loc|file)\b[^\n]*$", "", text)      # directives without a ';' 
    m = re.search(r"\.entry\s+(\w+)\s*\((.*?)\)", text, re.S)
    if not m:
        raise Unsupported("no .entry in the PTX")
    name = m.group(1)
    params = [(p.split()[-1], p.split()[1]) for p in m.group(2).split(",") if p.strip()]
    rest = text[m.end():]
    threads = 1
    for key in ("reqntid", "maxntid"):
        t = re.search(rf"\.{key}\s+([\d, ]+)", rest[:200])
        if t:
            threads = int(np.prod([int(v) for v in t.group(1).split(",")]))
            break
    body_start = rest.index("{")
    depth, end = 0, len(rest)
    for i in range(body_start, len(rest)):
        if rest[i] == "{":
            depth += 1
        elif rest[i] == "}":
            depth -= 1
            if depth == 0:
                end = i
                break
    body = rest[body_start + 1:end]
    instrs, labels = [], {}
    for lineno, stmt in enumerate(re.sub(r"\s+", " ", body).split(";")):
        stmt = stmt.strip()
        while True:                                   # labels and inline asm's scope braces
            lm = re.match(r"^(\$?[\w$]+):\s*", stmt)
            if lm:
                labels[lm.group(1)] = len(instrs)
                stmt = stmt[lm.end():]
                continue
            if stmt.startswith(("{", "}")):
                stmt = stmt[1:].strip()
                continue
            break
        if not stmt or stmt.startswith("."):
            continue
        pred = None
        if stmt.startswith("@"):
            pred, stmt = stmt.split(None, 1)
            pred = pred[1:]
        op, _, rest_args = stmt.partition(" ")
        instrs.append(Instr(op.strip(), _split_args(rest_args), pred, lineno))
    return Entry(name, params, instrs, labels, threads)


