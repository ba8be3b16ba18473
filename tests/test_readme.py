"""The README's first screen, as a new user meets it: every command in its ``bash`` blocks runs, as
written, on a fresh clone of this commit (``git clone``: committed files only, no venv, no build
directory), with the machine's pip configuration and cache, and the time each took is printed
beside its budget (the terminal summary; timings are reported, never asserted: the machine may be
loaded).

``scripts/test`` is the one command not run here: it is this suite, and ``.ci/run`` runs it, as
written, on a clean clone — checked below, so the README and CI cannot drift apart.
"""

import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from qkv import _native as native

ROOT = Path(__file__).resolve().parents[1]
SCREEN = 40
"""Lines a first screen may have: a terminal's worth."""

BUDGET = {"scripts/explain": 120.0, ".venv/bin/qkv info": 30.0}
"""Seconds per command on a fresh clone with a warm pip cache (issue 34's target for the main job)."""


def first_screen() -> list[str]:
    """The README up to its second ``## `` section: the title, the pitch and the first section."""
    lines = (ROOT / "README.md").read_text("utf-8").splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("## ")]
    return lines[: starts[1]] if len(starts) > 1 else lines


def commands() -> list[str]:
    """Each line of the first screen's ``bash`` blocks, without its comment."""
    text = "\n".join(first_screen())
    blocks = re.findall(r"^```bash\n(.*?)^```", text, re.M | re.S)
    lines = (line.split("  #")[0].strip() for block in blocks for line in block.splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def test_the_first_screen_is_a_screen_and_names_the_main_job():
    assert len(first_screen()) <= SCREEN, f"the README's first section ends at line {len(first_screen())}"
    assert commands()[0] == "scripts/explain"
    assert set(commands()) == set(BUDGET) | {"scripts/test"}, commands()  # a budget for each command run below


def test_ci_runs_scripts_test_as_the_readme_writes_it():
    run = [line.strip() for line in (ROOT / ".ci/run").read_text().splitlines()]
    assert "scripts/test" in commands() and "scripts/test" in run  # CI's first step, on a clean clone


@pytest.mark.slow  # a fresh clone installs qkv and builds the kernel: minutes
def test_every_first_screen_command_runs_on_a_fresh_clone(tmp_path, capsys):
    clone = tmp_path / "qkv"
    head = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
    subprocess.run(["git", "clone", "-q", "--no-checkout", ROOT, clone], check=True, timeout=300)
    subprocess.run(["git", "-C", clone, "checkout", "-q", "--detach", head.stdout.strip()], check=True, timeout=300)
    # a user's shell: none of the variables scripts/test or a venv set
    drop = {"PIP_CONSTRAINT", "QKV_VENV", "QKV_LOCK", "QKV_JAX_FFI", "VIRTUAL_ENV", "PYTHONPATH"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    times = []
    for command in commands():
        if command == "scripts/test":
            continue  # this suite: .ci/run runs it on a clean clone (the test above)
        load = os.getloadavg()[0]
        t0 = time.perf_counter()
        r = subprocess.run(command, shell=True, cwd=clone, env=env, capture_output=True, text=True, timeout=3600)
        seconds = time.perf_counter() - t0
        assert r.returncode == 0, f"{command} exited {r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
        times.append((command, seconds, load))
        if command == "scripts/explain":  # the worked example: O = AV and its lse
            assert re.search(r"0\.5989\s+1\.0000\s+0\.5989\s+1\.2033", r.stdout), r.stdout[-2000:]
            assert re.search(r"1\.6206\s+1\.6206", r.stdout)
        if command.endswith("qkv info"):
            assert re.search(r"^kernel\s+yes$", r.stdout, re.M), r.stdout  # the compiled kernel built
            # scripts/explain's quick build keeps the path a full build picks on this CPU
            assert re.search(rf"^ISA path\s+{native.isa()} ", r.stdout, re.M), (native.isa(), r.stdout)
    with capsys.disabled():
        for command, seconds, load in times:
            over = "" if seconds <= BUDGET[command] else "  OVER BUDGET"
            print(
                f"\nREADME first screen, fresh clone: `{command}` {seconds:.0f} s (budget {BUDGET[command]:.0f} s, "
                f"load {load:.1f} at the start){over}"
            )
