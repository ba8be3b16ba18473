"""The cost of attention, predicted: FLOPs and bytes per implementation; bytes sent per rank.

``estimate(...)`` counts what each impl of ``qkv.attention`` actually computes and keeps, so
the O(N²) everyone quotes can be checked against a program (``qkv complexity --measure``
runs the same configurations and prints prediction beside measurement).

FLOPs count the two (forward) or five (backward) matrix products, a multiply-add as 2; the
softmax's exp, max and sums are O(Nq·Nk) without a factor D and are not counted:

    forward  = 2 · B · H · P · (Dk + Dv)            4·B·H·Nq·Nk·Dk when dense with Dv = Dk
    backward = 2 · B · H · P · (3·Dk + 2·Dv)        S = QKᵀ recomputed, dV = AᵀdO, dP = dO Vᵀ,
                                                    dQ = dS K, dK = dSᵀQ: 2.5x the forward
                                                    (FlashAttention-2, arXiv:2307.08691)

``P`` is the number of (query, key) pairs per head the impl computes:

- ``"reference"``: ``Nq · Nk`` always: it materialises the whole score matrix and masks with a
  ``where`` (Vaswani et al., arXiv:1706.03762).
- ``"torch"``: ``Nq · Nk``: SDPA with an explicit mask computes every tile (its ``is_causal``
  fast path may skip some; then this is an upper bound).
- ``"flash"``: the pairs in every tile ``mask.blocks`` does not classify EMPTY at the tile
  sizes of the engine that runs the call: the compiled engine's ``qkv._native.tile_shape``
  (64 x 128) when it runs, else the array engine's ``qkv._impls.flash.choose_tiles`` (256 x 512
  when dense, smaller tiles along a narrow band); PARTIAL tiles count whole (FlashAttention,
  arXiv:2205.14135).
- ``"auto"`` resolves as ``qkv.attention`` does for NumPy inputs: ``"reference"`` below
  ``qkv._impls.SMALL`` score entries per head, ``"flash"`` above (for torch inputs, auto picks
  ``"torch"`` wherever SDPA can run the call: ask for ``impl="torch"``).

Bytes: ``c`` is the compute itemsize (float32 for half precision), ``L = B·H``.

- ``score_bytes``: one materialised ``(B, H, Nq, Nk)`` matrix, ``L·Nq·Nk·c``, for the
  reference; 0 for flash and torch (fused kernels never hold it).
- ``peak_bytes``: memory beyond the inputs and the output at the call's peak, as measured
  (benchmarks/LOG.md): reference 3 score matrices forward (S, exp(S − m), A) and 7 with
  ``backward`` (torch autograd keeps exp(S − m) and A and builds the gradients beside them;
  NumPy's ``attention_backward`` needs 4), plus the dense boolean mask; flash on the compiled
  engine ``lse`` and, per thread, one widened key tile with 16-row strips (backward: the strips
  and a bit per row; dQ goes straight into its output), plus a bit per cell of a mask
  without row intervals; flash on the array engine the per-tile
  working set (one ``L x block_q x block_k`` score tile forward, three backward, a query
  block and its accumulators) and ``lse``; torch SDPA's per-thread tile buffers plus, with a mask
  other than plain causal, the dense mask qkv builds and the float copy SDPA makes of it. With
  ``backward``, torch SDPA adds one gradient-sized copy (torch's gradient accumulation copies a
  gradient it cannot take over); flash's gradients are the outputs (autograd takes them over).
- ``kv_cache_bytes``: K and V for ``kv_heads`` heads in ``dtype``, ``B·Hkv·Nk·(Dk + Dv)`` items.

Where things live: ``_model`` (FLOPs per pair and pair counts, shared with ``qkv.bench``),
``_estimate`` (``estimate``, ``Estimate``), ``_communication`` (``communication``,
``Communication``: bytes per rank of ring and Ulysses attention).
"""

from ._communication import Communication as Communication
from ._communication import communication as communication
from ._estimate import Estimate as Estimate
from ._estimate import estimate as estimate

__all__ = ["Communication", "Estimate", "communication", "estimate"]

# Not in __all__: the FLOP and pair counts qkv.bench reports with.
from ._model import flops as flops  # noqa: E402
from ._model import mask_pairs as mask_pairs  # noqa: E402
from ._model import tile_pairs as tile_pairs  # noqa: E402
