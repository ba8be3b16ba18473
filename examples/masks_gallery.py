"""Every mask constructor, printed as a picture, and one attention call under each.

.venv/bin/python examples/masks_gallery.py
"""

import numpy as np

import qkv
from qkv import masks

rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((1, 2, 8, 4)) for _ in range(3))  # (B, H, N, D)

gallery = {
    "causal": masks.causal(),
    "sliding window 3": masks.sliding_window(3),
    "padding (B = 1, 5 real keys)": masks.padding(np.array([5])),
    "document & causal": masks.document(np.array([0, 0, 0, 1, 1, 2, 2, 2])) & masks.causal(),
    "prefix LM (3)": masks.prefix_lm(3),
    "Longformer": masks.sliding_window(2, causal=False) | masks.global_tokens([0]),
    "BigBird": masks.sliding_window(2, causal=False) | masks.global_tokens([0]) | masks.random_blocks(2, 1, seed=0),
    "dilated & causal": masks.dilated(2, 2) & masks.causal(),
}
for title, mask in gallery.items():
    out, weights = qkv.attention(q, k, v, mask=mask, return_weights=True)
    hidden = ~np.broadcast_to(mask.dense(8, 8), weights.shape)
    assert (weights[hidden] == 0).all()  # a hidden key gets exactly zero weight
    print(f"{title}\n{masks.picture(mask)}\n")
