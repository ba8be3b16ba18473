"""`import qkv` stays light: it never imports torch, and the NumPy core works without torch."""

import subprocess
import sys
import textwrap


def run_python(code):
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_import_qkv_does_not_import_torch():
    out = run_python("""
        import sys
        import qkv, qkv.masks, qkv.scores, qkv.errors
        print(sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")))
    """)
    assert out.strip() == "[]", f"import qkv imported: {out.strip()[:500]}"


def test_numpy_core_works_without_torch():
    """With torch unimportable, attention with masks, score mods, weights, lse and the backward
    pass all work; the result is checked against a plain NumPy computation."""
    out = run_python("""
        import sys

        class NoTorch:
            def find_spec(self, name, path=None, target=None):
                if name == "torch" or name.startswith("torch."):
                    raise ImportError("torch is blocked in this test")
                return None

        sys.meta_path.insert(0, NoTorch())
        import numpy as np
        import qkv
        from qkv import masks, scores

        rng = np.random.default_rng(0)
        q, k, v = rng.standard_normal((3, 2, 4, 5, 8))
        s = q @ np.swapaxes(k, -1, -2) / np.sqrt(8)
        allowed = np.tril(np.ones((5, 5), dtype=bool))
        e = np.where(allowed, np.exp(s - s.max(-1, keepdims=True)), 0)
        expected = (e / e.sum(-1, keepdims=True)) @ v

        out, w, lse = qkv.attention(q, k, v, mask=masks.causal() & masks.sliding_window(5),
                                    return_weights=True, return_lse=True)
        assert np.abs(out - expected).max() < 1e-12, np.abs(out - expected).max()
        out2 = qkv.attention(q, k, v, causal=True, score_mod=scores.softcap(30.0) + scores.alibi(n_heads=4),
                             impl="auto")
        assert out2.shape == (2, 4, 5, 8) and np.isfinite(out2).all()
        dq, dk, dv = qkv.attention_backward(np.ones_like(out), q, k, v, out, lse, causal=True)
        assert dq.shape == q.shape and np.isfinite(dq).all()
        assert np.abs(qkv.softmax(np.array([0.0, -np.inf])) - [1, 0]).max() == 0
        assert "torch" not in sys.modules
        print("ok")
    """)
    assert out.strip() == "ok"


def test_no_package_reaches_into_another_packages_private_modules():
    """A package's ``_private`` modules are its own: other packages import what they need from the
    package itself (its ``__init__``: the names it shares with the layers above, not in
    ``__all__``). The layers and the kernels' protection are import-linter's (pyproject.toml);
    this is the rule import-linter cannot say in one contract."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "src" / "qkv"
    found = []
    for path in root.rglob("*.py"):
        parts = path.relative_to(root).with_suffix("").parts
        package = parts[0] if len(parts) > 1 else None  # the top-level package this module belongs to
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or not node.module or node.level == 0:
                continue
            here = list(parts[:-1]) if path.name != "__init__.py" else list(parts[:-1])
            base = here[: len(here) - (node.level - 1)] if node.level > 1 else here
            target = [*base, *node.module.split(".")]
            if len(target) >= 2 and target[0] != package and target[1].startswith("_"):
                found.append(f"{path.relative_to(root)}:{node.lineno} imports qkv.{'.'.join(target)}")
    assert not found, "\n".join(found)


def test_a_torch_still_being_imported_by_another_thread_is_not_torch():
    """The lab imports torch in a background thread (its model loads at start); meanwhile
    ``sys.modules["torch"]`` is the half-built module (no ``torch.compiler``, no ``Tensor``), and a
    NumPy call that read it failed with AttributeError (HTTP 500 in the lab's first seconds)."""
    import subprocess
    import sys

    code = """
import importlib.machinery, sys, types
half = types.ModuleType("torch")
half.__spec__ = importlib.machinery.ModuleSpec("torch", None)
half.__spec__._initializing = True  # what importlib sets while the module's body runs
sys.modules["torch"] = half
import numpy as np
import qkv
rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((2, 5, 4)) for _ in range(3))
for impl in ("auto", "reference", "flash"):
    out = qkv.attention(q, k, v, causal=True, impl=impl)
    assert out.shape == (2, 5, 4) and np.isfinite(out).all()
assert not qkv.masks.compiling()
print("ok")
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr[-2000:]
