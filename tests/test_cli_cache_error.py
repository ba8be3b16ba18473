"""``qkv cache-error``: the per-head error of an 8-bit cache from the command line."""

import json

import numpy as np
import pytest
from typer.testing import CliRunner

import qkv
from qkv.cli import app


def test_json_gives_cache_errors_numbers_for_files(tmp_path):
    rng = np.random.default_rng(0)
    arrays = {
        n: rng.standard_normal(s).astype(np.float32)
        for n, s in (("q", (4, 3, 8)), ("k", (2, 40, 8)), ("v", (2, 40, 8)))
    }
    args = []
    for name, a in arrays.items():
        np.save(tmp_path / f"{name}.npy", a)
        args += [f"--{name}", str(tmp_path / f"{name}.npy")]
    res = CliRunner().invoke(app, ["cache-error", *args, "--causal", "--dtype", "int8,float8_e5m2", "--json"])
    assert res.exit_code == 0, res.output
    got = json.loads(res.output)
    assert set(got) == {"shape", "int8", "float8_e5m2"}
    for fmt in ("int8", "float8_e5m2"):
        want = qkv.diagnostics.cache_error(arrays["q"], arrays["k"], arrays["v"], fmt, causal=True)
        np.testing.assert_allclose(got[fmt]["relative"], want.relative, rtol=1e-12)
        np.testing.assert_allclose(got[fmt]["k_error"], want.k_error, rtol=1e-12)


def test_the_table_shows_every_head_of_every_format():
    res = CliRunner().invoke(app, ["cache-error", "--heads", "4", "--kv-heads", "2", "--nk", "64", "--d", "16"])
    assert res.exit_code == 0, res.output
    for word in ("int8", "float8_e4m3fn", "float8_e5m2", "rms error", "per kv head"):
        assert word in res.output
    assert res.output.count("█") >= 12  # a bar per head and format


@pytest.mark.parametrize(
    "args,words",
    [
        (["--per", "head", "--dtype", "int8"], "float8"),
        (["--dtype", "int4"], "--dtype"),
        (["--heads", "6", "--kv-heads", "4"], "multiple"),
        (["--per", "tensor"], "--per"),
    ],
)
def test_bad_options_are_one_line_errors(args, words):
    res = CliRunner().invoke(app, ["cache-error", "--nk", "16", *args])
    assert res.exit_code == 1 and words in res.output and len(res.output.strip().splitlines()) == 1
