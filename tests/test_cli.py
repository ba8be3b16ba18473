"""The ``qkv`` command through typer's test runner, the file readers, and one real subprocess."""

import json
import math
import subprocess
import sys

import numpy as np
import pytest
from typer.testing import CliRunner

from helpers import assert_one_line_error
from qkv._io import read_array, read_qkv
from qkv.cli import app
from qkv.errors import ArgumentError

LIT = {  # the literature example: with --scale 1, A and O below
    "q": [[1.0, 0.0], [0.0, 1.0]],
    "k": [[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]],
    "v": [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]],
}
LIT_A = [[0.4223, 0.1554, 0.4223], [0.1554, 0.4223, 0.4223]]
LIT_O = [[3.0, 4.0], [3.5339, 4.5339]]  # (1 + 8e) / (2e + 1) = 3.53391...


@pytest.fixture
def runner():
    return CliRunner()


def run(runner, *args):
    return runner.invoke(app, list(args))


def steps_of(result):
    assert result.exit_code == 0, result.output
    return {s["name"]: s for s in json.loads(result.stdout)["steps"]}


def test_help_lists_the_explain_command(runner):
    result = run(runner, "--help")
    assert result.exit_code == 0 and "explain" in result.stdout
    result = run(runner, "explain", "--help")
    assert result.exit_code == 0
    for option in ("--q", "--k", "--v", "--inputs", "--causal", "--scale", "--grad", "--json", "--html"):
        assert option in result.stdout


def test_explain_prints_the_builtin_example(runner):
    result = run(runner, "explain")
    assert result.exit_code == 0, result.output
    for text in ("S = Q Kᵀ", "A = softmax(S)", "O = A V", "0.5989", "1.0000", "1.2033", "0.7071"):
        assert text in result.stdout
    assert result.stderr == ""


def test_json_output_parses_and_has_the_steps(runner):
    steps = steps_of(run(runner, "explain", "--json"))
    assert {"Q", "K", "V", "S", "S_scaled", "A", "row_sum", "entropy", "O", "lse"} <= set(steps)
    np.testing.assert_allclose(steps["O"]["value"], [[0.5989, 1.0000], [0.5989, 1.2033]], atol=5e-5)
    np.testing.assert_allclose(steps["row_sum"]["value"], [1.0, 1.0], atol=1e-12)


def test_causal_hides_the_future_key(runner):
    result = run(runner, "explain", "--causal")
    assert result.exit_code == 0 and "-inf" in result.stdout and "where(mask, S, −∞)" in result.stdout
    steps = steps_of(run(runner, "explain", "--causal", "--json"))
    assert steps["S_masked"]["value"][0][2] == "-inf"
    np.testing.assert_allclose(steps["A"]["value"][0], [0.5, 0.5, 0.0], atol=1e-12)


def test_grad_adds_the_backward_steps(runner):
    steps = steps_of(run(runner, "explain", "--grad", "--json"))
    assert {"dO", "dV", "dA", "D", "dS", "dQ", "dK"} <= set(steps)
    e = math.exp(1 / math.sqrt(2))
    a = np.array([[e, e, 1], [1, e, e]]) / (2 * e + 1)  # by hand
    np.testing.assert_allclose(steps["dV"]["value"], a.T @ np.ones((2, 2)), atol=1e-12)  # dO = ones
    assert "dQ = dS K · scale" in run(runner, "explain", "--grad").stdout


def test_scale_one(runner):
    steps = steps_of(run(runner, "explain", "--scale", "1", "--json"))
    assert steps["S_scaled"]["value"] == steps["S"]["value"]
    e = math.e
    np.testing.assert_allclose(steps["A"]["value"][0], np.array([e, e, 1]) / (2 * e + 1), atol=1e-12)


def write(path, fmt, name, data, header=False):
    """Write one array to ``path/name.<fmt>`` and return the command-line argument naming it."""
    a = np.array(data)
    if fmt == "npy":
        np.save(path / f"{name}.npy", a)
        return str(path / f"{name}.npy")
    if fmt == "npz":
        np.savez(path / f"{name}.npz", a)  # one array: no key needed
        return str(path / f"{name}.npz")
    if fmt == "npz-key":
        np.savez(path / f"{name}.npz", x=a, other=np.zeros(3))
        return f"{path / name}.npz:x"
    if fmt == "json":
        (path / f"{name}.json").write_text(json.dumps(data))
        return str(path / f"{name}.json")
    if fmt == "json-key":
        (path / f"{name}.json").write_text(json.dumps({"note": [1.0], name: data}))
        return f"{path / name}.json:{name}"
    rows = ([",".join(f"c{j}" for j in range(a.shape[1]))] if header else []) + [",".join(map(str, r)) for r in data]
    (path / f"{name}.csv").write_text("\n".join(rows) + "\n")
    return str(path / f"{name}.csv")


@pytest.mark.parametrize("fmt", ["npy", "npz", "npz-key", "json", "json-key", "csv", "csv-header"])
def test_inputs_from_files_reproduce_the_literature_example(runner, tmp_path, fmt):
    args = [f"--{n}" for n in "qkv"]
    files = [write(tmp_path, fmt.removesuffix("-header"), n, LIT[n], header=fmt == "csv-header") for n in "qkv"]
    result = run(
        runner, "explain", *(x for pair in zip(args, files, strict=True) for x in pair), "--scale", "1", "--json"
    )
    steps = steps_of(result)
    np.testing.assert_allclose(steps["A"]["value"], LIT_A, atol=5e-5)
    np.testing.assert_allclose(steps["O"]["value"], LIT_O, atol=5e-5)
    assert json.loads(result.stdout)["inputs"] == {"q": [2, 2], "k": [3, 2], "v": [3, 2]}


@pytest.mark.parametrize("fmt", ["npz", "json"])
def test_inputs_option_reads_q_k_v_from_one_file(runner, tmp_path, fmt):
    path = tmp_path / f"qkv.{fmt}"
    if fmt == "npz":
        np.savez(path, **{n: np.array(x) for n, x in LIT.items()})
    else:
        path.write_text(json.dumps(LIT))
    steps = steps_of(run(runner, "explain", "--inputs", str(path), "--scale", "1", "--json"))
    np.testing.assert_allclose(steps["O"]["value"], LIT_O, atol=5e-5)


def test_html_is_written(runner, tmp_path):
    out = tmp_path / "trace.html"
    result = run(runner, "explain", "--grad", "--html", str(out))
    assert result.exit_code == 0 and "0.5989" in result.stdout
    page = out.read_text(encoding="utf-8")
    assert 'data-step="A"' in page and 'data-step="dQ"' in page and "<td>1.2033</td>" in page


def bad_inputs(tmp_path, case):
    """Command-line arguments for one kind of bad input."""
    good = {n: write(tmp_path, "json", n, LIT[n]) for n in "qkv"}
    if case == "missing":
        good["q"] = str(tmp_path / "nope.npy")
    elif case == "extension":
        (tmp_path / "q.txt").write_text("1 0\n0 1\n")
        good["q"] = str(tmp_path / "q.txt")
    elif case == "ragged":
        (tmp_path / "r.json").write_text("[[1, 0], [0]]")
        good["q"] = str(tmp_path / "r.json")
    elif case == "not-numeric":
        (tmp_path / "k.csv").write_text("1,0\n1,x\n0,1\n")
        good["k"] = str(tmp_path / "k.csv")
    elif case == "shape":
        good["k"] = write(tmp_path, "npy", "k3", [[1.0, 0.0, 0.0]] * 3)
    return ["--q", good["q"], "--k", good["k"], "--v", good["v"]]


@pytest.mark.parametrize(
    "case,words",
    [
        ("missing", ["nope.npy", "no such file"]),
        ("extension", ["q.txt", "unknown extension '.txt'"]),
        ("ragged", ["r.json", "ragged"]),
        ("not-numeric", ["k.csv", "not numeric", "line 2, column 2"]),
        ("shape", ["ShapeError", "d_k=3", "d_k=2"]),
    ],
)
def test_bad_inputs_give_one_error_line_and_exit_1(runner, tmp_path, case, words):
    assert_one_line_error(run(runner, "explain", *bad_inputs(tmp_path, case)), *words)


def test_incomplete_or_conflicting_options_are_one_line_errors(runner, tmp_path):
    assert_one_line_error(run(runner, "explain", "--q", "a.npy"), "missing: --k, --v")
    both = ["--inputs", "x.npz", "--q", "a.npy"]
    assert_one_line_error(run(runner, "explain", *both), "not both")
    assert_one_line_error(run(runner, "explain", "--inputs", "x.npy"), ".npz or .json")
    np.savez(tmp_path / "two.npz", q=np.eye(2), k=np.eye(2))
    assert_one_line_error(run(runner, "explain", "--inputs", str(tmp_path / "two.npz")), "no array 'v'")


def test_read_array_details(tmp_path):
    np.savez(tmp_path / "many.npz", a=np.eye(2), b=np.ones(3))
    with pytest.raises(ArgumentError, match=r"holds 2 arrays \(a, b\); name one as .*many.npz:KEY"):
        read_array(tmp_path / "many.npz")
    assert read_array(f"{tmp_path / 'many.npz'}:b").tolist() == [1.0, 1.0, 1.0]
    (tmp_path / "inf.json").write_text('{"x": [[0, "-inf"], [1.5, -2]]}')
    assert read_array(tmp_path / "inf.json").tolist() == [[0.0, -np.inf], [1.5, -2.0]]  # the only key
    (tmp_path / "h.csv").write_text("a, b\n1, 2\n\n3, 4\n")
    assert read_array(tmp_path / "h.csv").tolist() == [[1.0, 2.0], [3.0, 4.0]]
    (tmp_path / "r.csv").write_text("1,2\n3\n")
    with pytest.raises(ArgumentError, match="ragged: line 2 has 1 values but line 1 has 2"):
        read_array(tmp_path / "r.csv")
    (tmp_path / "s.json").write_text('[[1, "x"]]')
    with pytest.raises(ArgumentError, match=r'not numeric: \[0\]\[1\] is "x"'):
        read_array(tmp_path / "s.json")
    (tmp_path / "bad.npy").write_text("not numpy")
    with pytest.raises(ArgumentError, match="bad.npy: not a .npy file"):
        read_array(tmp_path / "bad.npy")
    (tmp_path / "bad.json").write_text("[[1, 2]")
    with pytest.raises(ArgumentError, match="bad.json: not valid JSON"):
        read_array(tmp_path / "bad.json")
    with pytest.raises(ArgumentError, match="only selects an array in a .npz or .json"):
        read_array(f"{tmp_path / 'h.csv'}:x")
    np.savez(tmp_path / "qkv.npz", q=np.eye(2), k=np.ones((3, 2)), v=np.zeros((3, 4)))
    assert [a.shape for a in read_qkv(tmp_path / "qkv.npz")] == [(2, 2), (3, 2), (3, 4)]


def test_python_dash_m_qkv_runs_end_to_end(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "qkv", "explain", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    steps = {s["name"]: s for s in json.loads(done.stdout)["steps"]}
    np.testing.assert_allclose(steps["O"]["value"], [[0.5989, 1.0000], [0.5989, 1.2033]], atol=5e-5)
    failed = subprocess.run(
        [sys.executable, "-m", "qkv", "explain", "--q", "nope.npy", "--k", "k.npy", "--v", "v.npy"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
    )
    assert failed.returncode == 1 and failed.stdout == ""
    assert failed.stderr.strip() == "error: ArgumentError: nope.npy: no such file"


def test_import_qkv_does_not_import_typer_rich_or_torch():
    code = "import sys, qkv; qkv.explain(); print(sorted(m for m in ('typer', 'rich', 'torch') if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "[]"


def test_every_subcommand_of_the_real_qkv_app_has_help():
    runner = CliRunner()
    for command in ("explain", "bench", "complexity", "train"):
        res = runner.invoke(app, [command, "--help"])
        assert res.exit_code == 0, (command, res.output)
        assert "Usage" in res.output


def test_qkv_complexity_gives_the_classic_4_3_gb_of_weights():
    res = CliRunner().invoke(
        app, ["complexity", "--n", "2048", "--batch", "8", "--heads", "32", "--impl", "reference", "--json"]
    )
    assert res.exit_code == 0, res.output
    row = json.loads(res.stdout)["rows"][0]
    assert row["score_bytes"] == 8 * 32 * 2048**2 * 4  # 4.29e9 bytes


def test_qkv_bench_quick_runs_through_the_real_app():
    res = CliRunner().invoke(app, ["bench", "--quick", "--workload", "causal", "--n", "256", "--mode", "fwd", "--json"])
    assert res.exit_code == 0, res.output
    ok = [r for r in json.loads(res.stdout) if r["status"] == "ok"]
    assert {"qkv-flash", "qkv-auto", "sdpa-flash"} <= {r["impl"] for r in ok}
    assert all(math.isfinite(r["median_s"]) and r["median_s"] > 0 for r in ok)


# --------------------------------------------------------------------------- one error path


def _one_line(result, code):
    assert result.exit_code == code, (result.exit_code, result.output)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), result.stderr
    assert "Traceback" not in result.output


BAD_USAGE = [  # what click rejects while parsing: exit 2, one line
    ("explain", "--nope"),
    ("heatmap", "--n", "x"),
    ("heatmap", "--n", "0"),
    ("pe", "--n", "100000"),
    ("complexity", "--d", "0"),
    ("train", "--steps", "0"),
    ("bench", "--suite", "nope"),
    ("lab", "--port", "70000"),
]
BAD_INPUT = [  # what qkv rejects: exit 1, one line naming the problem
    (("explain", "--q", "missing.npy", "--k", "missing.npy", "--v", "missing.npy"), "missing.npy"),
    (("explain", "--q", "missing.npy"), "--q, --k and --v go together"),
    (("heatmap", "--mask", "nonsense"), "unknown mask kind"),
    (("pe", "--kind", "fourier"), "--kind must be one of"),
    (("complexity", "--n", "12,x"), "--n must be comma-separated integers"),
    (("complexity", "--plot", "cost.bmp"), "--plot writes .png, .svg or .pdf"),
    (("train", "--task", "juggle", "--steps", "1"), "juggle"),
]


@pytest.mark.parametrize("args", BAD_USAGE, ids=lambda a: " ".join(a))
def test_bad_usage_is_one_line_and_exit_2(runner, args):
    _one_line(run(runner, *args), 2)


@pytest.mark.parametrize("args,words", BAD_INPUT, ids=lambda a: " ".join(a) if isinstance(a, tuple) else None)
def test_bad_input_is_one_line_and_exit_1(runner, args, words, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = run(runner, *args)
    _one_line(result, 1)
    assert words in result.stderr
    assert list(tmp_path.iterdir()) == []  # nothing written


def _files(d):
    """Hostile or broken input files (each small on disk)."""
    import io
    import zipfile

    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f8", "fortran_order": False, "shape": (10**6, 10**6)})
    (d / "huge.npy").write_bytes(header.getvalue() + b"\0" * 16)
    with zipfile.ZipFile(d / "huge.npz", "w") as z:
        z.writestr("q.npy", header.getvalue() + b"\0" * 16)
    (d / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (d / "field.csv").write_text('"' + "1" * 200_000 + '"\n')
    np.save(d / "vec.npy", np.ones(4))
    np.save(d / "empty.npy", np.ones((0, 4)))
    np.save(d / "ok.npy", np.ones((5, 4)))
    np.save(d / "long.npy", np.zeros((20_000, 2)))


FILE_CASES = [
    (["explain", "--q", "huge.npy", "--k", "huge.npy", "--v", "huge.npy"], "header claims shape (1000000, 1000000)"),
    (["explain", "--q", "huge.npz", "--k", "huge.npz", "--v", "huge.npz"], "header claims shape (1000000, 1000000)"),
    (["explain", "--q", "deep.json", "--k", "deep.json", "--v", "deep.json"], "nested too deeply"),
    (["explain", "--q", "field.csv", "--k", "field.csv", "--v", "field.csv"], "field larger than field limit"),
    (["heatmap", "--q", "vec.npy", "--k", "vec.npy", "--v", "vec.npy"], "q has 1 axes but needs at least 2"),
    (["heatmap", "--q", "empty.npy", "--k", "ok.npy", "--v", "ok.npy"], "no cells to draw (Nq=0"),
    (["explain", "--q", "long.npy", "--k", "long.npy", "--v", "long.npy"], "would hold ~17.9 GiB"),
]


@pytest.mark.parametrize("args,words", FILE_CASES, ids=[w for _, w in FILE_CASES])
def test_hostile_files_are_one_line_errors_and_write_nothing(runner, args, words, tmp_path, monkeypatch):
    _files(tmp_path)
    monkeypatch.chdir(tmp_path)
    before = sorted(tmp_path.iterdir())
    result = run(runner, *args)
    _one_line(result, 1)
    assert words in result.stderr, result.stderr
    assert sorted(tmp_path.iterdir()) == before  # no output file, not even a partial one


def test_huge_complexity_lengths_are_answered_at_once(runner):
    result = run(runner, "complexity", "--n", "2147483647", "--impl", "flash", "--mask", "causal", "--json")
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.stdout)["rows"]
    assert row["n_q"] == 2**31 - 1 and 0.49 < row["kept_fraction"] < 0.51
