"""The tutorial and the README are executable: their ```python blocks run in order in one
namespace, and their ```console blocks run each `$ k31dsl ...` line through the CLI.

Block markers (leading comment lines of a python block):
  # file: NAME.py       save the block as NAME.py (importable by later blocks) and run it from there
  # expect: K31Error    the block must raise K31Error; the ```text block right after it shows the
                        message, which must equal str(error) with the temp folder removed
Lines under a `$ k31dsl ...` line in a console block must each appear in that command's output
(within one line; `...` matches anything, and a line of just `...` is skipped).
"""
from __future__ import annotations

import os
import re
import shlex
import sys
from pathlib import Path

import pytest

from k31dsl import K31Error
from k31dsl.cli import main

ROOT = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.M | re.S)


def blocks(path: Path) -> list[tuple[str, str]]:
    return [(lang, body) for lang, body in FENCE.findall(path.read_text())]


def markers(body: str) -> dict[str, str]:
    found = {}
    for line in body.splitlines():
        m = re.match(r"#\s*(file|expect):\s*(\S+)", line)
        if not m:
            break
        found[m.group(1)] = m.group(2)
    return found


def run_console(body: str, capsys) -> None:
    commands: list[tuple[str, list[str]]] = []
    for line in body.splitlines():
        if line.startswith("$ "):
            commands.append((line[2:], []))
        elif commands and line.strip() and line.strip() != "...":
            commands[-1][1].append(line.strip())
    for command, expected in commands:
        argv = shlex.split(command)
        assert argv[0] == "k31dsl", f"console blocks run k31dsl commands only: {command}"
        capsys.readouterr()
        rc = main(argv[1:])
        captured = capsys.readouterr()
        output = captured.out + captured.err
        assert rc == 0, f"`{command}` exited {rc}:\n{output}"
        for want in expected:
            pattern = ".*".join(re.escape(part) for part in want.split("..."))
            assert re.search(pattern, output), \
                f"`{command}` did not print {want!r}; it printed:\n{output}"


def run_markdown(path: Path, tmp_path: Path, capsys, monkeypatch) -> int:
    """Run every python/console block of a markdown file; returns how many python blocks ran."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    before = set(sys.modules)
    namespace: dict = {"__name__": "__doc_blocks__"}
    found = blocks(path)
    ran = 0
    try:
        for i, (lang, body) in enumerate(found):
            if lang == "console":
                run_console(body, capsys)
                continue
            if lang != "python":
                continue
            marks = markers(body)
            file = tmp_path / marks.get("file", f"_doc_block_{i}.py")
            file.write_text(body)
            code = compile(body, str(file), "exec")
            if marks.get("expect") == "K31Error":
                with pytest.raises(K31Error) as caught:
                    exec(code, namespace)
                assert i + 1 < len(found) and found[i + 1][0] == "text", \
                    f"{path.name}: the block expecting K31Error must be followed by a ```text block"
                shown = found[i + 1][1].rstrip()
                actual = str(caught.value).replace(str(tmp_path) + os.sep, "").rstrip()
                assert actual == shown, f"{path.name}: the error message changed:\n{actual}"
            else:
                assert "expect" not in marks, f"unknown expectation {marks['expect']}"
                exec(code, namespace)
            ran += 1
    finally:
        for name in set(sys.modules) - before:
            mod = sys.modules.get(name)
            if str(tmp_path) in str(getattr(mod, "__file__", "") or ""):
                del sys.modules[name]
    return ran


def test_tutorial_runs(tmp_path, capsys, monkeypatch):
    assert run_markdown(ROOT / "docs" / "writing-a-kernel.md", tmp_path, capsys, monkeypatch) >= 6


def test_readme_examples_run(tmp_path, capsys, monkeypatch):
    assert run_markdown(ROOT / "README.md", tmp_path, capsys, monkeypatch) >= 1


def test_readme_commands_match_ci():
    """The README's test command is the one .ci/run runs, and the set-up pins the CPU torch."""
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    m = re.search(r"^\.venv/bin/python -m pytest[^\n]*$", readme, re.M)
    assert m, "README lacks the test command"
    assert m.group(0).strip() in ci
    assert "pip install torch==2.13.0" in readme and "pip install torch==2.13.0" in ci
    assert "pip install -e '.[test]'" in readme and "pip install -e '.[test]'" in ci
