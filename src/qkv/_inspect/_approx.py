"""What replacing exact attention by an approximation would lose on one real input, head by head.

Every head is recomputed in float64 from the q, k, v, scale and mask it had in the forward
pass (``qkv.attention``, exact), then approximated five ways; the losses are measured with
``qkv.diagnostics`` on that same head:

- ``window``: exact attention under ``qkv.masks.sliding_window(w)`` (causal for a decoder);
- ``longformer``: the window ``| global_tokens(...)`` (Beltagy et al., arXiv:2004.05150);
- ``bigbird``: that ``| random_blocks(block, per_row, seed)`` (Zaheer et al., arXiv:2007.14062);
- ``performer``: FAVOR+ random features (Choromanski et al., arXiv:2009.14794), ``qkv.approx.performer``;
- ``linformer``: ``qkv.approx.linformer`` (Wang et al., arXiv:2006.04768) with the key projection
  ``E`` onto the keys' top ``rank`` principal directions (the least-squares best rank-``r``
  summary of K) and the value projection ``F`` fitted by least squares so that the effective
  weights ``softmax(Q (E K)ᵀ · scale) F`` come closest to this head's exact weights. The paper
  learns ``E`` and ``F`` over a corpus; fitting them to the very input measured is the most
  favourable case. A causal model has no Linformer (its projections mix future keys into every
  row): NaN there.

Per head: ``error``, the output's relative error ``‖Ô − O‖ / ‖O‖`` (``diagnostics.compare``);
``kl``, the mean over query rows of ``KL(exact ‖ approximate)`` weights (``diagnostics.kl``:
infinite where the approximation gives zero or negative weight to a key the head uses, which is
always the case for a sparse pattern and usually for Linformer's effective weights); and for
the three masks ``mass_outside``, the mean over rows of the exact mass the pattern leaves out.
"""

from dataclasses import dataclass
from typing import Any

import numpy as np

from .. import approx, diagnostics, masks, scores
from .._checks import check_int
from .._core import attention
from ..errors import ArgumentError
from ._json import floats

METHODS = ("window", "longformer", "bigbird", "performer", "linformer")
MASKED = METHODS[:3]


@dataclass(frozen=True, eq=False, repr=False)
class Approximations:
    """The loss of each approximation (``methods``, with human ``labels`` and their ``params``) on
    each kept head: ``error``, ``kl`` and ``mass_outside``, each ``(methods, layers, heads)``
    (NaN where a measure does not apply), heads named by ``layer_ids`` and ``head_ids``."""

    methods: tuple[str, ...]
    labels: tuple[str, ...]
    params: dict[str, Any]
    layer_ids: tuple[int, ...]
    head_ids: tuple[int, ...]
    error: np.ndarray
    kl: np.ndarray
    mass_outside: np.ndarray

    def table(self, method: str, measure: str = "error") -> np.ndarray:
        """The ``(layers, heads)`` table of one ``method`` and ``measure`` (error, kl, mass_outside)."""
        if method not in self.methods:
            raise ArgumentError(f"method must be one of {', '.join(self.methods)}, got {method!r}")
        if measure not in ("error", "kl", "mass_outside"):
            raise ArgumentError(f"measure must be error, kl or mass_outside, got {measure!r}")
        return np.asarray(getattr(self, measure)[self.methods.index(method)])

    def _where(self, flat_index: int) -> str:
        li, hi = divmod(flat_index, len(self.head_ids))
        return f"layer {self.layer_ids[li]} head {self.head_ids[hi]}"

    def summary(self, keep: float = 0.95, tolerance: float = 0.1) -> list[str]:
        """One sentence per method: for the masks, in how many heads they keep at least ``keep``
        of the attention mass (mean over rows); for the others, in how many heads the output's
        relative error is at most ``tolerance``."""
        lines = []
        for m, (method, label) in enumerate(zip(self.methods, self.labels, strict=True)):
            err = self.error[m].ravel()
            n = err.size
            if np.isnan(err).all():
                lines.append(f"{label}: not applicable to this model")
                continue
            median = float(np.nanmedian(err))
            if method in MASKED:
                kept = 1.0 - self.mass_outside[m].ravel()
                worst = int(np.argmin(kept))
                lines.append(
                    f"{label} keeps ≥ {keep:.0%} of the attention mass in {int((kept >= keep).sum())} of {n} heads "
                    f"(least: {kept[worst]:.0%}, {self._where(worst)}); median output error {median:.1%}"
                )
            else:
                worst = int(np.nanargmax(err))
                lines.append(
                    f"{label}: output error ≤ {tolerance:.0%} in {int((err <= tolerance).sum())} of {n} heads "
                    f"(median {median:.1%}; worst {err[worst]:.0%}, {self._where(worst)})"
                )
        return lines

    def to_dict(self) -> dict[str, Any]:
        """JSON-safe: the tables as nested lists of float32 values, None where NaN or infinite."""
        return {
            "methods": list(self.methods),
            "labels": list(self.labels),
            "params": dict(self.params),
            "layer_ids": list(self.layer_ids),
            "head_ids": list(self.head_ids),
            "error": floats(self.error),
            "kl": floats(self.kl),
            "mass_outside": floats(self.mass_outside),
            "summary": self.summary(),
        }


def patterns(
    causal: bool, window: int, global_tokens: tuple[int, ...], block: int, per_row: int, seed: int
) -> list[Any]:
    """The three sparse patterns as ``qkv.masks.Mask`` objects: window, Longformer, BigBird."""
    w = masks.sliding_window(window, causal=causal)
    longformer = w | masks.global_tokens(list(global_tokens))
    return [w, longformer, longformer | masks.random_blocks(block, per_row, seed)]


def linformer_projections(
    q: np.ndarray, k: np.ndarray, exact_weights: np.ndarray, scale: float, rank: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(E, F)``, each ``(r, N)``: ``E`` projects the keys onto their top-``rank`` principal
    directions (all of them, ``E = I``, when ``rank >= N``); ``F`` solves the least-squares problem
    ``min ‖softmax(Q (E K)ᵀ · scale) F − A‖`` for this head's exact weights ``A``."""
    n = k.shape[0]
    if rank >= n:
        e = np.eye(n)
    else:
        u, _, _ = np.linalg.svd(k, full_matrices=False)
        e = u[:, : min(rank, u.shape[1])].T
    _, a_r = attention(q, e @ k, e @ k, scale=scale, return_weights=True)
    f, *_ = np.linalg.lstsq(a_r, exact_weights, rcond=None)
    return e, f


def _losses(exact_out: np.ndarray, exact_w: np.ndarray, out: np.ndarray, w: np.ndarray) -> tuple[float, float]:
    return diagnostics.compare(out, exact_out).overall, float(np.mean(diagnostics.kl(exact_w, w)))


def approximate(
    insp: Any,
    *,
    window: int,
    global_tokens: tuple[int, ...],
    block: int,
    per_row: int,
    n_features: int,
    rank: int,
    seed: int,
) -> Approximations:
    """The ``Approximations`` of an ``Inspection`` (see ``Inspection.approximations``)."""
    window = check_int(window, "window", minimum=1)
    block, per_row = check_int(block, "block", minimum=1), check_int(per_row, "per_row", minimum=0)
    n_features, rank = check_int(n_features, "n_features", minimum=1), check_int(rank, "rank", minimum=1)
    seed = check_int(seed, "seed", minimum=0)
    glob = tuple(check_int(g, "global_tokens", minimum=0) for g in global_tokens)
    n = len(insp.tokens)
    sparse = [p.dense(n, n) for p in patterns(insp.causal, window, glob, block, per_row, seed)]
    shape = (len(METHODS), len(insp.layer_ids), len(insp.head_ids))
    error, kl, outside = np.full(shape, np.nan), np.full(shape, np.nan), np.full(shape, np.nan)
    eye = np.eye(n)
    for li in range(shape[1]):
        allowed, scale, cap = insp.allowed[li], float(insp.scaling[li]), insp.softcap[li]
        mod = None if cap is None else scores.softcap(cap)
        for hi in range(shape[2]):
            q, k, v = (np.asarray(x[li, hi], dtype=np.float64) for x in (insp.q, insp.k, insp.v))
            exact_out, exact_w = attention(q, k, v, mask=allowed, scale=scale, score_mod=mod, return_weights=True)
            for m, pattern in enumerate(sparse):
                out, w = attention(q, k, v, mask=allowed & pattern, scale=scale, score_mod=mod, return_weights=True)
                error[m, li, hi], kl[m, li, hi] = _losses(exact_out, exact_w, out, w)
                outside[m, li, hi] = float(np.mean(diagnostics.mass_outside(exact_w, pattern)))
            q_default = q * (scale * np.sqrt(q.shape[-1]))  # performer and linformer use 1/sqrt(Dk)
            perf = approx.performer(q_default, k, v, n_features=n_features, seed=seed, causal=insp.causal)
            perf_w = approx.performer(q_default, k, eye, n_features=n_features, seed=seed, causal=insp.causal)
            error[3, li, hi], kl[3, li, hi] = _losses(exact_out, exact_w, perf, perf_w)
            if not insp.causal:
                e, f = linformer_projections(q, k, exact_w, scale, rank)
                lin = approx.linformer(q_default, k, v, e, f)
                lin_w = approx.linformer(q_default, k, eye, e, f)
                error[4, li, hi], kl[4, li, hi] = _losses(exact_out, exact_w, lin, lin_w)
    globals_text = "+".join(map(str, glob)) or "none"
    return Approximations(
        methods=METHODS,
        labels=(
            f"sliding window {window}",
            f"Longformer (window {window}, global {globals_text})",
            f"BigBird (window {window}, global {globals_text}, {per_row} random block(s) of {block})",
            f"Performer ({n_features} features)",
            f"Linformer (rank {rank})",
        ),
        params={
            "window": window,
            "global_tokens": list(glob),
            "block": block,
            "per_row": per_row,
            "n_features": n_features,
            "rank": rank,
            "seed": seed,
        },
        layer_ids=tuple(insp.layer_ids),
        head_ids=tuple(insp.head_ids),
        error=error.astype(np.float32),
        kl=kl.astype(np.float32),
        mass_outside=outside.astype(np.float32),
    )
