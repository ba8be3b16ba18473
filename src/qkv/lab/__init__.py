"""``qkv lab``: a local web lab for attention, driven by the library (FastAPI + uvicorn).

Five pages share one look: **Explain** (the ``qkv.explain`` trace of your Q, K, V), **Heatmap**
(``qkv.attention`` weights under a mask, a scale and a temperature, with entropy per row),
**Positional encodings** (sinusoidal, RoPE, ALiBi, and the learned table of a trained model),
**Complexity** (``qkv.complexity.estimate`` over N, with a measure button) and **Training** (a
``TinyGPT`` learning a toy task, its loss and attention maps streamed as server-sent events).

The server computes, the browser only draws: every number on a page comes from a JSON endpoint
under ``/api`` that calls qkv. The pages (``qkv/lab/pages``) and their
assets (``qkv/lab/static``) ship in the package (no network at run time).

    >>> from qkv.lab.app import create_app          # needs the 'lab' extra (fastapi, uvicorn)
    >>> app = create_app(max_n=64)

Importing ``qkv.lab`` imports nothing heavy; ``create_app`` lives in ``qkv.lab.app``.
"""
