"""``qkv heatmap``, ``qkv pe`` and ``qkv train --record`` through typer's runner (one real
subprocess): files are written, valid (magic bytes), of the requested pixel size; ``--json``
numbers equal the float64 oracle's weights, row sums and entropies; bad input gives one
``error: ...`` line and exit 1."""

import json
import subprocess
import sys

import numpy as np
import pytest
from typer.testing import CliRunner

pytest.importorskip("matplotlib")
from PIL import Image  # noqa: E402

from oracle import attention_oracle, causal_allowed, sliding_window_allowed  # noqa: E402
from qkv.cli import app  # noqa: E402

PNG, GIF = b"\x89PNG\r\n\x1a\n", b"GIF89a"
EXAMPLE = {
    "q": [[1.0, 0.0], [0.0, 1.0]],
    "k": [[1.0, 0.0], [1.0, 1.0], [0.0, 1.0]],
    "v": [[1.0, 0.0], [0.0, 2.0], [1.0, 1.0]],
}


@pytest.fixture
def runner():
    return CliRunner()


def ok(runner, *args):
    res = runner.invoke(app, [str(a) for a in args])
    assert res.exit_code == 0, res.output
    return res


def fails(runner, *args, words=()):
    res = runner.invoke(app, [str(a) for a in args])
    assert res.exit_code == 1, res.output
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    for w in words:
        assert w in lines[0]
    return lines[0]


def png_size(path):
    assert path.read_bytes()[:8] == PNG
    with Image.open(path) as im:
        return im.size


def entropy(w):
    logs = np.log(np.where(w > 0, w, 1.0))
    return -(w * logs).sum(-1)


def test_heatmap_default_is_the_worked_example(runner, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    d = json.loads(ok(runner, "heatmap", "--json").stdout)
    assert d["path"] == "heatmap.png" and d["format"] == "png"
    assert png_size(tmp_path / "heatmap.png") == (d["width_px"], d["height_px"])
    _, w, _ = attention_oracle(*(np.array(EXAMPLE[x]) for x in "qkv"))
    assert d["shapes"] == {"q": [2, 2], "k": [3, 2], "v": [3, 2], "weights": [2, 3]}
    (panel,) = d["panels"]
    np.testing.assert_allclose(panel["row_sums"], w.sum(-1), rtol=1e-12)
    np.testing.assert_allclose(panel["entropy"], entropy(w), rtol=1e-12)
    np.testing.assert_allclose(panel["entropy_normalised"], entropy(w) / np.log(3), rtol=1e-12)
    assert "wrote heatmap.png (png, " in ok(runner, "heatmap").stdout


def test_heatmap_files_mask_causal_overlay_tokens(runner, tmp_path, rng):
    q, k, v = rng.standard_normal((3, 2, 6, 4))  # H=2, N=6, D=4
    for name, x in zip("qkv", (q, k, v), strict=True):
        np.save(tmp_path / f"{name}.npy", x)
    out = tmp_path / "h.png"
    d = json.loads(
        ok(
            runner,
            "heatmap",
            "--q",
            tmp_path / "q.npy",
            "--k",
            tmp_path / "k.npy",
            "--v",
            tmp_path / "v.npy",
            "--mask",
            "sliding_window:window=3,causal=false",
            "--causal",
            "--overlay",
            "--tokens",
            "a,b,c,d,e,f",
            "--scale",
            "0.7",
            "--out",
            out,
            "--size",
            "7x3",
            "--dpi",
            "80",
            "--json",
        ).stdout
    )
    assert png_size(out) == (560, 240) == (d["width_px"], d["height_px"])
    allowed = sliding_window_allowed(6, 6, 3, causal=False) & causal_allowed(6, 6)
    _, w, _ = attention_oracle(q, k, v, allowed=allowed, scale=0.7)
    assert d["mask"] == "(sliding_window(3, causal=False) & causal)" and d["shapes"]["weights"] == [2, 6, 6]
    for h, panel in enumerate(d["panels"]):
        assert panel["index"] == [h]
        np.testing.assert_allclose(panel["row_sums"], w[h].sum(-1), rtol=1e-12)
        np.testing.assert_allclose(panel["entropy"], entropy(w[h]), rtol=1e-10, atol=1e-14)
        n_allowed = allowed.sum(-1)
        norm = np.where(n_allowed > 1, entropy(w[h]) / np.log(np.maximum(n_allowed, 2)), 0.0)
        np.testing.assert_allclose(panel["entropy_normalised"], norm, rtol=1e-10, atol=1e-14)


def test_heatmap_inputs_temperature_and_formats(runner, tmp_path, rng):
    q, k, v = rng.standard_normal((2, 5, 3)), rng.standard_normal((2, 7, 3)), rng.standard_normal((2, 7, 2))
    np.savez(tmp_path / "qkv.npz", q=q, k=k, v=v)
    (tmp_path / "qkv.json").write_text(json.dumps({"q": q.tolist(), "k": k.tolist(), "v": v.tolist()}))
    _, w, _ = attention_oracle(q, k, v, scale=1 / np.sqrt(3) / 2.5)
    for src, fmt in (("qkv.npz", "svg"), ("qkv.json", "html")):
        out = tmp_path / f"h.{fmt}"
        d = json.loads(
            ok(runner, "heatmap", "--inputs", tmp_path / src, "--temperature", "2.5", "--out", out, "--json").stdout
        )
        assert d["format"] == fmt and d["shapes"]["weights"] == [2, 5, 7]
        np.testing.assert_allclose([p["entropy"] for p in d["panels"]], entropy(w), rtol=1e-10)
        text = out.read_text()
        assert (
            ("<svg" in text[:400])
            if fmt == "svg"
            else (text.startswith("<!doctype html>") and "<svg" in text and "entropy (nats)" in text)
        )
    ok(runner, "heatmap", "--n", "4", "--format", "svg", "--out", tmp_path / "noext")
    assert b"<svg" in (tmp_path / "noext").read_bytes()[:400]


def test_heatmap_random_and_mask_only(runner, tmp_path):
    d = json.loads(
        ok(
            runner,
            "heatmap",
            "--n",
            "10",
            "--d",
            "4",
            "--heads",
            "3",
            "--seed",
            "1",
            "--out",
            tmp_path / "r.png",
            "--json",
        ).stdout
    )
    assert d["shapes"]["q"] == [3, 10, 4] and len(d["panels"]) == 3
    np.testing.assert_allclose([p["row_sums"] for p in d["panels"]], 1.0, rtol=1e-12)
    d = json.loads(
        ok(
            runner,
            "heatmap",
            "--mask-only",
            "--mask",
            "bigbird:block=4,per_row=1,seed=2",
            "--n",
            "24",
            "--out",
            tmp_path / "m.png",
            "--size",
            "5x5",
            "--json",
        ).stdout
    )
    assert png_size(tmp_path / "m.png") == (500, 500) and d["shape"] == [24, 24]
    from qkv import masks

    expected = masks.sliding_window(3, causal=False) | masks.global_tokens([0]) | masks.random_blocks(4, 1, 2)
    assert d["allowed_per_row"] == expected.dense(24, 24).sum(-1).tolist()
    d = json.loads(ok(runner, "heatmap", "--mask-only", "--causal", "--out", tmp_path / "c.png", "--json").stdout)
    assert d["allowed_per_row"] == list(range(1, 17))


def test_heatmap_errors(runner, tmp_path):
    np.save(tmp_path / "q.npy", np.ones((3, 4)))
    np.save(tmp_path / "k.npy", np.ones((3, 5)))
    np.save(tmp_path / "big.npy", np.ones((513, 2)))
    out = ["--out", tmp_path / "x.png"]
    fails(runner, "heatmap", "--mask", "flash", *out, words=["ArgumentError", "unknown mask kind 'flash'"])
    fails(runner, "heatmap", "--mask", "sliding_window:size=3", *out, words=["allowed: window, causal"])
    fails(
        runner,
        "heatmap",
        "--q",
        tmp_path / "nope.npy",
        "--k",
        tmp_path / "k.npy",
        "--v",
        tmp_path / "k.npy",
        *out,
        words=["nope.npy"],
    )
    fails(
        runner,
        "heatmap",
        "--q",
        tmp_path / "q.npy",
        "--k",
        tmp_path / "k.npy",
        "--v",
        tmp_path / "k.npy",
        *out,
        words=["ShapeError", "d_k=5"],
    )
    fails(
        runner,
        "heatmap",
        "--q",
        tmp_path / "big.npy",
        "--k",
        tmp_path / "big.npy",
        "--v",
        tmp_path / "big.npy",
        *out,
        words=["too large to draw", "512"],
    )
    fails(runner, "heatmap", "--n", "600", *out, words=["at most 512"])
    fails(runner, "heatmap", "--size", "7by3", *out, words=["--size must be WIDTHxHEIGHT"])
    fails(runner, "heatmap", "--size", "100x100", *out, words=["16..8000 pixels"])
    fails(runner, "heatmap", "--format", "svg", *out, words=["--format svg but the output file"])
    fails(runner, "heatmap", "--out", tmp_path / "x.jpg", words=["cannot tell the picture format"])
    fails(runner, "heatmap", "--mask-only", *out, words=["--mask-only draws a mask"])
    fails(runner, "heatmap", "--tokens", "a,b", *out, words=["--tokens has 2 labels but the keys have Nk=3"])
    fails(
        runner,
        "heatmap",
        "--n",
        "4",
        "--q",
        tmp_path / "q.npy",
        "--k",
        tmp_path / "q.npy",
        "--v",
        tmp_path / "q.npy",
        *out,
        words=["not both"],
    )
    fails(runner, "heatmap", "--out", tmp_path / "missing" / "x.png", words=["missing"])
    assert not (tmp_path / "x.png").exists()


def test_pe_each_kind_and_all(runner, tmp_path):
    for kind, fmt in (("sinusoidal", "png"), ("rope", "svg"), ("alibi", "html")):
        out = tmp_path / f"{kind}.{fmt}"
        d = json.loads(
            ok(runner, "pe", "--kind", kind, "--n", "16", "--d", "8", "--heads", "4", "--out", out, "--json").stdout
        )
        (f,) = d["files"]
        assert f["kind"] == kind and f["format"] == fmt and out.stat().st_size > 1000
        if fmt == "png":
            assert png_size(out) == (f["width_px"], f["height_px"])
        if kind == "rope":
            assert d["rope_spread"] < 1e-9
        if kind == "alibi":
            np.testing.assert_allclose(d["alibi_slopes"], 2.0 ** (-8.0 * np.arange(1, 5) / 4))
            assert "ALiBi slope per head" in out.read_text()
    d = json.loads(ok(runner, "pe", "--out-dir", tmp_path / "all", "--size", "6x3", "--dpi", "50", "--json").stdout)
    assert [f["kind"] for f in d["files"]] == ["sinusoidal", "rope", "alibi"]
    for f in d["files"]:
        assert png_size(tmp_path / "all" / f"pe_{f['kind']}.png") == (300, 150)


def test_pe_errors(runner, tmp_path):
    fails(runner, "pe", "--kind", "learned", words=["--kind must be one of sinusoidal, rope, alibi, all"])
    fails(runner, "pe", "--out", tmp_path / "a.png", words=["--out-dir DIR with --kind all"])
    fails(runner, "pe", "--kind", "rope", "--d", "7", "--out", tmp_path / "a.png", words=["d must be even"])
    fails(runner, "pe", "--kind", "alibi", "--n", "600", "--out", tmp_path / "a.png", words=["n must be an integer"])


def test_train_record_writes_gif_grid_curves_history(runner, tmp_path):
    pytest.importorskip("torch")
    rec = tmp_path / "rec"
    res = ok(runner, "train", "--task", "copy", "--steps", "12", "--length", "3", "--record", rec, "--json")
    d = json.loads(res.stdout)
    assert [s["step"] for s in d["attention"]] == list(range(13))  # default K = max(1, 12 // 20)
    assert sorted(d["files"]) == sorted(
        str(rec / n) for n in ("attention.gif", "attention_grid.png", "curves.png", "history.npz")
    )
    assert (rec / "attention.gif").read_bytes()[:6] == GIF
    with Image.open(rec / "attention.gif") as im:
        assert im.n_frames == 13
    assert png_size(rec / "attention_grid.png")[1] > png_size(rec / "attention_grid.png")[0]  # 12 rows x 4 heads
    png_size(rec / "curves.png")
    saved = np.load(rec / "history.npz")
    assert saved["attention_layer1"].shape == (13, 4, 6, 6) and saved["loss"].shape == (12,)
    res = ok(
        runner,
        "train",
        "--task",
        "copy",
        "--steps",
        "2",
        "--length",
        "3",
        "--record",
        rec,
        "--record-every",
        "1",
        "--layer",
        "0",
    )
    assert "pictures in" in res.stdout and "attention.gif" in res.stdout  # with the progress bar, not --json
    with Image.open(rec / "attention.gif") as im:
        assert im.n_frames == 3
    fails(
        runner,
        "train",
        "--task",
        "copy",
        "--steps",
        "2",
        "--length",
        "3",
        "--record",
        tmp_path / "no",
        "--layer",
        "3",
        words=["--layer must be in -2..1"],
    )
    assert not (tmp_path / "no").exists()  # refused before training


def test_one_real_process(tmp_path):
    out = tmp_path / "h.png"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "qkv",
            "heatmap",
            "--n",
            "5",
            "--heads",
            "2",
            "--mask",
            "document:doc_lengths=2+3",
            "--overlay",
            "--out",
            str(out),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    d = json.loads(res.stdout)
    assert png_size(out) == (d["width_px"], d["height_px"]) and d["mask"] == "document"
    res = subprocess.run(
        [sys.executable, "-m", "qkv", "heatmap", "--mask", "document:doc_lengths=2+2", "--n", "5"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 1 and res.stderr.startswith("error: ArgumentError: mask 'document' parameter")
