"""Which pattern a head follows, computed from its weights alone (no list of known heads).

The patterns are the ones found in BERT by Clark et al., "What does BERT look at?"
(arXiv:1906.04341), and Kovaleva et al. (arXiv:1908.08593): attention to the previous or next
token, to itself, at a fixed offset, within a local window, to the first token ([CLS] or BOS),
to separators ([SEP], EOS), or spread broadly over the sentence.

For a pattern ``P`` (for each query row ``i``, the keys ``P_i`` it points at) the score is the
attention mass on ``P`` beyond what uniform attention would put there, averaged over the rows::

    r_i = (m_i - u_i) / (1 - u_i),    m_i = sum_{j in P_i} A_ij,    u_i = |P_i| / n_i

where ``n_i`` is the number of keys row ``i`` may attend. Only rows where the pattern says
something count (``P_i`` holds at least one allowed key, and not all of them); the mean is
clipped at 0. A head that puts all of every row's mass on ``P`` scores 1, uniform attention 0,
so a wide pattern (a window) gains nothing from its width alone. Offsets are looked at up to
``N // 2`` (a farther one exists in fewer than half the rows: offset -12 of a 13-token text is
only "the last token looks at the first") and windows up to ``N // 4 + 1`` keys on each side
(a wider window is most of the text). ``broad`` is scored by the mean normalised entropy
(``qkv.diagnostics.entropy``: 1 = uniform over the allowed keys).

The dominant pattern: the best of the structured patterns if it scores at least ``SHARP``
(between patterns within ``TIE`` of the best, the more specific one: a single key before a
window); else ``broad`` if the mean normalised entropy is at least ``BROAD``; else ``mixed``
(no simple pattern explains half the mass: content-dependent attention), scored with the best
structured score.
"""

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from ..diagnostics import entropy
from ..errors import ArgumentError, ShapeError

PATTERNS = ("self", "previous", "next", "offset", "first", "separator", "local", "broad", "mixed")
"""Every pattern name, structured ones in order of specificity (the order that breaks ties)."""
STRUCTURED = PATTERNS[:7]
SHARP = 0.5  # a structured pattern names a head when it explains at least half the mass beyond chance
BROAD = 0.75  # mean normalised entropy above which a head without a sharp pattern is "broad"
TIE = 0.05  # patterns this close to the best count as tied; the more specific one wins
MAX_SPAN = 32  # offsets and window sizes looked at, at most: |offset| <= 32, window size <= 32


class HeadPattern(NamedTuple):
    """A head's dominant ``pattern`` (one of ``PATTERNS``), its ``score`` in [0, 1], its ``param``
    (the offset for ``offset``, the window size for ``local``, else None) and every pattern's score."""

    pattern: str
    score: float
    param: int | None
    scores: dict[str, float]

    def label(self, tokens: Sequence[str] | None = None, separators: Sequence[int] = ()) -> str:
        """A short human name: ``previous token``, ``offset +2``, ``window 3``, ``first token ([CLS])``."""
        return describe(self.pattern, self.param, tokens, separators)


def describe(
    pattern: str, param: int | None, tokens: Sequence[str] | None = None, separators: Sequence[int] = ()
) -> str:
    """The human name of a pattern, with the token it points at when ``tokens`` are given."""
    if pattern == "offset":
        return f"offset {param:+d}" if param is not None else "offset"
    if pattern == "local":
        return f"window {param}" if param is not None else "window"
    if pattern == "first":
        return f"first token ({tokens[0]})" if tokens else "first token"
    if pattern == "separator":
        names = sorted({tokens[j] for j in separators}) if tokens else []
        return f"separator ({', '.join(names)})" if names else "separator"
    return {"self": "self", "previous": "previous token", "next": "next token"}.get(pattern, pattern)


def _rows(m: np.ndarray, count: np.ndarray, n: np.ndarray) -> np.ndarray:
    """The chance-corrected score ``(...,)`` from per-row mass ``m``, pattern sizes ``count`` and allowed keys ``n``."""
    valid = (count >= 1) & (count < n)
    u = np.where(valid, count / np.maximum(n, 1), 0.0)
    r = np.where(valid, (m - u) / np.where(valid, 1.0 - u, 1.0), 0.0)
    rows = valid.sum(-1)
    mean = np.where(rows > 0, r.sum(-1) / np.maximum(rows, 1), 0.0)
    return np.clip(mean, 0.0, 1.0)


def _check(weights: Any, allowed: Any) -> tuple[np.ndarray, np.ndarray]:
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim < 2 or w.shape[-1] != w.shape[-2]:
        raise ShapeError(f"weights must be square self-attention maps (..., N, N), got shape {w.shape}")
    n = w.shape[-1]
    a = np.ones((n, n), dtype=bool) if allowed is None else np.asarray(allowed, dtype=bool)
    try:
        a = np.broadcast_to(a, w.shape)
    except ValueError:
        raise ShapeError(f"allowed has shape {a.shape}, which does not broadcast to the weights' {w.shape}") from None
    return w, a


def pattern_scores(
    weights: Any, allowed: Any = None, separators: Sequence[int] = ()
) -> dict[str, tuple[np.ndarray, np.ndarray | None]]:
    """Every pattern's score for weights ``(..., N, N)`` (rows are queries): ``{name: (score (...),
    param (...) or None)}``. ``allowed`` (bool, broadcasting to the weights; True = may attend)
    is the model's mask (None: every key); ``separators`` are the positions of separator tokens."""
    w, a = _check(weights, allowed)
    n = w.shape[-1]
    if any(not 0 <= s < n for s in separators):
        raise ArgumentError(f"separators must be positions in 0..{n - 1}, got {list(separators)}")
    keys = a.sum(-1).astype(np.float64)  # n_i
    i = np.arange(n)
    span = min(n - 1, MAX_SPAN)
    offsets = np.arange(-span, span + 1)
    j = i[:, None] + offsets[None, :]  # (N, 2·span+1): key of row i at each offset
    inside = (j >= 0) & (j < n)
    jc = np.clip(j, 0, n - 1)
    ok = inside & np.take_along_axis(a, np.broadcast_to(jc, (*a.shape[:-1], jc.shape[-1])), axis=-1)
    mass = np.where(ok, np.take_along_axis(w, np.broadcast_to(jc, (*w.shape[:-1], jc.shape[-1])), axis=-1), 0.0)
    count = ok.astype(np.float64)

    def at(d: int) -> np.ndarray:
        return _rows(mass[..., d + span], count[..., d + span], keys)

    out: dict[str, tuple[np.ndarray, np.ndarray | None]] = {
        "self": (at(0), None),
        "previous": (at(-1), None) if span >= 1 else (np.zeros(w.shape[:-2]), None),
        "next": (at(1), None) if span >= 1 else (np.zeros(w.shape[:-2]), None),
    }
    far = [int(d) for d in offsets if 2 <= abs(d) <= n // 2]
    if far:
        by_offset = np.stack([at(d) for d in far], -1)
        best = by_offset.argmax(-1)
        out["offset"] = (np.take_along_axis(by_offset, best[..., None], -1)[..., 0], np.asarray(far)[best])
    else:
        out["offset"] = (np.zeros(w.shape[:-2]), np.zeros(w.shape[:-2], dtype=int))
    out["first"] = (_rows(np.where(a[..., 0], w[..., 0], 0.0), a[..., 0].astype(np.float64), keys), None)
    sep = np.zeros(n, dtype=bool)
    sep[list(separators)] = True
    sep_ok = a & sep
    out["separator"] = (_rows(np.where(sep_ok, w, 0.0).sum(-1), sep_ok.sum(-1).astype(np.float64), keys), None)
    sizes = list(range(2, min(span, n // 4 + 1) + 1))  # qkv.masks.sliding_window(size, causal=False): |i - j| < size
    if sizes:
        band_mass = [mass[..., span - (s - 1) : span + s].sum(-1) for s in sizes]
        band_count = [count[..., span - (s - 1) : span + s].sum(-1) for s in sizes]
        by_size = np.stack([_rows(m, c, keys) for m, c in zip(band_mass, band_count, strict=True)], -1)
        best_score = by_size.max(-1, keepdims=True)
        narrowest = (by_size >= best_score - TIE).argmax(-1)  # the first (narrowest) window near the best
        out["local"] = (np.take_along_axis(by_size, narrowest[..., None], -1)[..., 0], np.asarray(sizes)[narrowest])
    else:
        out["local"] = (np.zeros(w.shape[:-2]), np.zeros(w.shape[:-2], dtype=int))
    e = np.asarray(entropy(w, mask=a).normalised)
    multi = keys > 1  # rows with one allowed key have no entropy to speak of
    out["broad"] = (np.where(multi.any(-1), (e * multi).sum(-1) / np.maximum(multi.sum(-1), 1), 0.0), None)
    return out


def dominant(scores: dict[str, float], params: Mapping[str, int | None]) -> HeadPattern:
    """The dominant pattern of one head from its pattern scores (the rule in the module docstring)."""
    best = max(scores[p] for p in STRUCTURED)
    if best >= SHARP:
        name = next(p for p in STRUCTURED if scores[p] >= best - TIE)
        return HeadPattern(name, scores[name], params.get(name), scores)
    if scores["broad"] >= BROAD:
        return HeadPattern("broad", scores["broad"], None, scores)
    return HeadPattern("mixed", best, None, scores)


def head_patterns(weights: Any, allowed: Any = None, separators: Sequence[int] = ()) -> list[Any]:
    """The dominant pattern of every head of ``weights (..., N, N)``, nested like the leading axes
    (a ``HeadPattern`` for one ``(N, N)`` map, a list for ``(H, N, N)``, a list of lists for
    ``(L, H, N, N)``).

    >>> prev = np.eye(5, k=-1); prev[0, 0] = 1.0
    >>> head_patterns(prev).pattern
    'previous'
    """
    table = pattern_scores(weights, allowed, separators)
    lead = np.shape(table["self"][0])

    def one(index: tuple[int, ...]) -> HeadPattern:
        scores = {name: round(float(s[index]), 6) for name, (s, _) in table.items()}
        params = {name: int(p[index]) for name, (_, p) in table.items() if p is not None}
        return dominant(scores, params)

    def nest(prefix: tuple[int, ...]) -> Any:
        if len(prefix) == len(lead):
            return one(prefix)
        return [nest((*prefix, k)) for k in range(lead[len(prefix)])]

    return nest(())
