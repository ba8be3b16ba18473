"""Every runnable example in the docs runs: the README's Python blocks and examples/*.py."""

import re
import runpy
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))


def readme_blocks():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


@pytest.mark.parametrize("index", range(len(readme_blocks())))
def test_readme_python_blocks_run(index):
    exec(compile(readme_blocks()[index], f"README.md block {index}", "exec"), {})


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_example_scripts_run(path, capsys):
    runpy.run_path(str(path), run_name="__main__")
    assert capsys.readouterr().out  # each example shows something
