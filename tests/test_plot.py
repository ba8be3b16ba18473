"""``qkv.plot``: figures built directly (axes per head, labels, margins, sizes) and the files they
write (magic bytes, pixel sizes, GIF frames). Numbers drawn are checked against independent
computations (NumPy entropy, the RoPE rotation by hand)."""

import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("matplotlib")
from PIL import Image  # noqa: E402

import qkv  # noqa: E402
from qkv import masks, plot  # noqa: E402
from qkv.errors import ArgumentError, MaskError, ShapeError  # noqa: E402
from qkv.plot import _common  # noqa: E402

PNG, GIF = b"\x89PNG\r\n\x1a\n", b"GIF89a"


def softmax(s):
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def panel_axes(fig):
    """The image panels (axes holding an image, colorbars excluded)."""
    return [ax for ax in fig.axes if ax.images and ax.get_label() != "<colorbar>"]


def test_import_qkv_plot_does_not_import_matplotlib():
    code = "import sys, qkv, qkv.plot; print(any(m.startswith('matplotlib') for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_heatmap_one_panel_per_head_with_labels_and_margin(rng):
    w = softmax(rng.standard_normal((3, 4, 5)))
    fig = plot.heatmap(w, tokens_q=list("abcd"), tokens_k=list("vwxyz"), titles=["x", "y", "z"])
    axes = panel_axes(fig)
    assert len(axes) == 3 and [ax.get_title() for ax in axes] == ["x", "y", "z"]
    assert [t.get_text() for t in axes[0].get_xticklabels()] == list("vwxyz")
    assert [t.get_text() for t in axes[0].get_yticklabels()] == list("abcd")
    np.testing.assert_array_equal(axes[1].images[0].get_array(), w[1])
    # the margin: row sum and entropy (nats) of each row, computed here with NumPy
    margin = [c for c in axes[2].child_axes if c.get_yticklabels()][0]
    expected = [f"{s:4.2f} {h:4.2f}" for s, h in zip(w[2].sum(-1), -(w[2] * np.log(w[2])).sum(-1), strict=True)]
    assert [t.get_text() for t in margin.get_yticklabels()] == expected
    assert sum(1 for ax in fig.axes if ax.get_label() == "<colorbar>") == 1


def test_heatmap_default_titles_and_batch_panels(rng):
    w = softmax(rng.standard_normal((2, 2, 3, 3)))
    assert [ax.get_title() for ax in panel_axes(plot.heatmap(w))] == ["b0 h0", "b0 h1", "b1 h0", "b1 h1"]
    assert [ax.get_title() for ax in panel_axes(plot.heatmap(w[0]))] == ["head 0", "head 1"]
    assert [t.get_text() for t in panel_axes(plot.heatmap(w[0, 0]))[0].get_xticklabels()] == ["k0", "k1", "k2"]


def test_heatmap_overlay_hides_and_hatches_masked_cells(rng):
    m = masks.causal()
    _, w = qkv.attention(*rng.standard_normal((3, 2, 6, 4)), mask=m, return_weights=True)
    fig = plot.heatmap(w, mask=m)
    for ax in panel_axes(fig):
        shown = ax.images[0].get_array()
        np.testing.assert_array_equal(np.ma.getmaskarray(shown), ~np.tri(6, dtype=bool))
        hatched = [c for c in ax.collections if c.get_hatch()]
        assert len(hatched) == 1 and len(hatched[0].get_paths()) == 5  # one run per row with hidden keys
    fig = plot.heatmap(w, mask=m, overlay=False)
    assert not np.ma.getmaskarray(panel_axes(fig)[0].images[0].get_array()).any()


def test_row_stats_match_numpy(rng):
    w = softmax(rng.standard_normal((2, 5, 7)))
    s = plot.row_stats(w)
    np.testing.assert_allclose(s["sum"], w.sum(-1))
    np.testing.assert_allclose(s["entropy"], -(w * np.log(w)).sum(-1))
    np.testing.assert_allclose(s["entropy_normalised"], -(w * np.log(w)).sum(-1) / np.log(7))


def test_annotations_only_for_small_panels(rng):
    w = softmax(rng.standard_normal((2, 3)))
    texts = [t.get_text() for t in panel_axes(plot.heatmap(w))[0].texts]
    assert [f"{x:.2f}" for x in w.ravel()] == [t for t in texts if t[0].isdigit()]
    big = softmax(rng.standard_normal((12, 12)))
    assert not [t for t in panel_axes(plot.heatmap(big))[0].texts if t.get_text()[0].isdigit()]


def test_heatmap_errors(rng):
    with pytest.raises(ShapeError, match="weights must have shape"):
        plot.heatmap(np.ones(3))
    with pytest.raises(ArgumentError, match="at most 512 tokens"):
        plot.heatmap(np.ones((2, 513)))
    with pytest.raises(ArgumentError, match="tokens_k has 2 labels but the axis has 3"):
        plot.heatmap(np.ones((2, 3)), tokens_k=["a", "b"])
    with pytest.raises(MaskError, match="does not broadcast"):
        plot.heatmap(np.ones((2, 3)), mask=np.ones((3, 3), bool))
    with pytest.raises(ArgumentError, match="titles has 1 entries but there are 2 panels"):
        plot.heatmap(np.ones((2, 2, 3)), titles=["a"])
    with pytest.raises(ArgumentError, match="too many to draw"):
        plot.heatmap(np.ones((33, 2, 2)))


def test_mask_picture():
    m = masks.sliding_window(3) | masks.global_tokens([0])
    fig = plot.mask_picture(m, 10, 10, title="longformer")
    (ax,) = panel_axes(fig)
    np.testing.assert_array_equal(ax.images[0].get_array(), m.dense(10, 10).astype(np.int8))
    assert ax.get_title().startswith("longformer") and f"{int(m.dense(10, 10).sum())} of 100" in ax.get_title()


@pytest.mark.parametrize(("width", "height", "dpi"), [(3.3, 2.1, 100), (6.4, 4.8, 72), (5.0, 3.0, 150)])
def test_exact_pixel_size_and_magic_bytes(tmp_path, width, height, dpi, rng):
    fig = plot.heatmap(softmax(rng.standard_normal((2, 4, 4))), width=width, height=height, dpi=dpi)
    png, svg, html = tmp_path / "a.png", tmp_path / "a.svg", tmp_path / "a.html"
    plot.save(fig, png, "png")
    plot.save(fig, svg, "svg")
    plot.save(fig, html, "html", tables=[("numbers", ["x"], [[0.5]])])
    assert png.read_bytes()[:8] == PNG
    with Image.open(png) as im:
        assert im.size == (round(width * dpi), round(height * dpi))
    assert b"<svg" in svg.read_bytes()[:400]
    page = html.read_text()
    assert page.startswith("<!doctype html>") and "<svg" in page and "<td>0.5000</td>" in page


def test_format_of():
    assert _common.format_of("x.PNG") == "png" and _common.format_of("x", "svg") == "svg"
    with pytest.raises(ArgumentError, match="cannot tell the picture format"):
        _common.format_of("x.jpg")
    with pytest.raises(ArgumentError, match="--format svg but the output file 'x.png' ends in .png"):
        _common.format_of("x.png", "svg")
    with pytest.raises(ArgumentError, match="format must be one of png, svg, html"):
        _common.format_of("x", "pdf")
    with pytest.raises(ArgumentError, match="each side must be 16..8000 pixels"):
        _common.pixel_size(100, 100, 100)


def test_sinusoidal_figure_shows_the_table_and_its_similarity():
    fig = plot.sinusoidal_figure(16, 8)
    table, sim = panel_axes(fig)
    pos, i = np.arange(16)[:, None], np.arange(4)[None, :]
    expected = np.empty((16, 8))
    expected[:, 0::2], expected[:, 1::2] = np.sin(pos / 10000 ** (2 * i / 8)), np.cos(pos / 10000 ** (2 * i / 8))
    np.testing.assert_allclose(table.images[0].get_array(), expected, atol=1e-12)
    np.testing.assert_allclose(sim.images[0].get_array(), expected @ expected.T, atol=1e-12)


def test_rope_scores_depend_only_on_the_offset():
    r = plot.pe.rope_numbers(16, 8, positions=(0, 3, 50))
    assert r["scores"].shape == (3, 16) and r["spread"] < 1e-9
    # by hand: rotate pairs (c, c + D/2) by pos * base^(-2c/D)
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((2, 1, 8))

    def rot(x, p):
        th = p * 10000.0 ** (-np.arange(0, 8, 2) / 8)
        a, b = x[:4], x[4:]
        return np.concatenate([a * np.cos(th) - b * np.sin(th), b * np.cos(th) + a * np.sin(th)])

    for j, off in enumerate(r["offsets"]):
        assert r["scores"][1, j] == pytest.approx(rot(q[0], 3 + off) @ rot(k[0], 3), abs=1e-12)
    fig = plot.rope_figure(16, 8)
    assert len(fig.axes[1].lines) == 4 and "≤" in fig.axes[1].get_legend().get_title().get_text()
    with pytest.raises(ArgumentError, match="d must be even"):
        plot.rope_figure(16, 7)


def test_alibi_figure_one_panel_per_head():
    fig = plot.alibi_figure(6, 3)
    axes = panel_axes(fig)
    assert len(axes) == 3
    slopes = qkv.positional.alibi_slopes(3)
    for h, ax in enumerate(axes):
        shown = np.asarray(ax.images[0].get_array())
        i, j = np.tril_indices(6)
        np.testing.assert_allclose(shown[i, j], -slopes[h] * (i - j))
        assert np.isnan(shown[np.triu_indices(6, 1)]).all()
    with pytest.raises(ArgumentError, match="positional kind must be one of"):
        plot.positional("learned")


def fake_history(steps=(0, 5, 10), heads=2, t=5, layers=2, rng=None):
    rng = rng or np.random.default_rng(0)
    snaps = [
        SimpleNamespace(step=s, weights=[softmax(rng.standard_normal((heads, t, t))) for _ in range(layers)])
        for s in steps
    ]
    return SimpleNamespace(
        task="copy",
        attention=snaps,
        loss=list(np.linspace(2, 0.1, 10)),
        accuracy=list(np.linspace(0, 1, 10)),
        probe=np.arange(t + 1),
    )


def test_attention_grid_rows_are_steps_and_columns_heads(rng):
    h = fake_history(heads=3, rng=rng)
    fig = plot.attention_grid(h, layer=0)
    axes = panel_axes(fig)
    assert len(axes) == 3 * 3
    assert [ax.get_ylabel() for ax in axes[::3]] == ["step 0", "step 5", "step 10"]
    assert [ax.get_title() for ax in axes[:3]] == ["head 0", "head 1", "head 2"]
    np.testing.assert_array_equal(axes[4].images[0].get_array(), h.attention[1].weights[0][1])
    many = fake_history(steps=range(0, 100, 5), rng=rng)
    labels = [ax.get_ylabel() for ax in panel_axes(plot.attention_grid(many)) if ax.get_ylabel()]
    assert len(labels) == 12 and labels[0] == "step 0" and labels[-1] == "step 95"
    with pytest.raises(ArgumentError, match="layer must be in -2..1"):
        plot.attention_grid(h, layer=2)
    with pytest.raises(ArgumentError, match="no recorded attention maps"):
        plot.attention_grid(SimpleNamespace(attention=[]))


def test_curves_entropy_per_head(rng):
    h = fake_history(rng=rng)
    fig = plot.curves(h, layer=1)
    loss, acc, ent = fig.axes
    np.testing.assert_allclose(loss.lines[0].get_ydata(), h.loss)
    assert len(ent.lines) == 2
    w = np.stack([s.weights[1] for s in h.attention])
    expected = (-(w * np.log(w)).sum(-1) / np.log(5)).mean(-1)  # (steps, heads)
    np.testing.assert_allclose(ent.lines[1].get_ydata(), expected[:, 1])
    np.testing.assert_array_equal(ent.lines[1].get_xdata(), [0, 5, 10])


def test_animation_has_a_frame_per_recorded_step(tmp_path, rng):
    path = tmp_path / "a.gif"
    assert plot.save_animation(fake_history(steps=(0, 1, 2, 3), rng=rng), path) == 4
    assert path.read_bytes()[:6] == GIF
    with Image.open(path) as im:
        assert im.n_frames == 4
