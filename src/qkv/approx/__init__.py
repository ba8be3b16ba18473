"""Approximate attention: linear attention, Performer (FAVOR+), Linformer; and sparse recipes.

Each trades accuracy for speed; ``qkv.diagnostics.compare`` and ``kl`` measure how much a given
input loses (BENCHMARKS.md, "Accuracy versus speed of the approximations"). Shapes and kinds
follow ``qkv.attention``: ``q (*B, H, Nq, Dk)``, ``k (*B, Hkv, Nk, Dk)``, ``v (*B, Hkv, Nk, Dv)``
-> ``(*B, H, Nq, Dv)``, grouped heads (``H % Hkv == 0``) without copying K or V, NumPy in ->
NumPy out, torch in -> torch out with autograd; half precision computes in float32.
``causal=True`` is bottom-right aligned like ``qkv.attention`` (query ``i`` sees ``j <= i + Nk - Nq``).

- ``linear_attention``: ``φ(q)(φ(k)ᵀ V) / φ(q)(φ(k)ᵀ 1)``, ``φ = elu + 1`` (Katharopoulos et al.,
  arXiv:2006.16236), O(N·D²); not an approximation of softmax but a different kernel.
- ``performer``: FAVOR+ positive orthogonal random features whose inner products estimate
  ``exp(q·k / √Dk)`` without bias (Choromanski et al., arXiv:2009.14794): softmax attention
  with the default scale, approximately, in O(N·m·D).
- ``linformer``: exact attention over ``r`` projected keys and values (Wang et al.,
  arXiv:2006.04768), O(N·r·D).

Sparse patterns are *exact* attention under a ``qkv.masks.Mask``, run by the flash kernel,
which skips every tile the mask empties (measured in BENCHMARKS.md):

    >>> from qkv import masks
    >>> longformer = masks.sliding_window(256, causal=False) | masks.global_tokens([0])  # arXiv:2004.05150
    >>> out = qkv.attention(q, k, v, mask=longformer, impl="flash")
    >>> bigbird = longformer | masks.random_blocks(64, per_row=3, seed=0)  # arXiv:2007.14062
    >>> out = qkv.attention(q, k, v, mask=bigbird, impl="flash")

``qkv.diagnostics.mass_outside(weights, mask)`` tells how much exact attention mass a pattern
leaves out.

Where things live: ``_kernelised`` (linear attention and Performer: a feature map, then
``_sums``' prefix sums), ``_features`` (the feature maps), ``_linformer``.
"""

from ._kernelised import linear_attention as linear_attention
from ._kernelised import performer as performer
from ._linformer import linformer as linformer

__all__ = ["linear_attention", "linformer", "performer"]
