"""The candidates a benchmark compares, each built into a zero-argument callable per case.

- ``qkv-flash``, ``qkv-auto``, ``qkv-reference``, ``qkv-torch``: ``qkv.attention`` with that
  ``impl`` on torch tensors (forward+backward through torch autograd); ``qkv-flash-np`` and
  ``qkv-auto-np``: the same on NumPy arrays (backward by ``qkv.attention_backward``);
- ``sdpa-flash``, ``sdpa-math``: ``torch.nn.functional.scaled_dot_product_attention`` pinned
  to one backend with ``torch.nn.attention.sdpa_kernel``, given ``is_causal`` for plain causal
  and the equivalent dense boolean mask for every other mask;
- ``numpy``: the naive ``softmax(Q Kᵀ · scale) V`` below, forward only;
- ``flex``: FlexAttention compiled on the CPU (``_flex``), forward only.

A built callable returns the arrays it computed (``out``, then ``dq, dk, dv`` for
forward+backward) so a run can check every candidate against the baseline's numbers.
"""

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

import qkv

from ._workloads import Inputs, Unavailable, Workload, make_inputs

Run = Callable[[], list[Any]]

MATERIALISED_LIMIT = 2 << 30
"""Skip candidates that materialise score matrices beyond this many bytes (the machine is shared)."""


class CaseData:
    """Inputs and masks of one case, built on first use and shared by its candidates."""

    def __init__(self, w: Workload, seed: int = 0):
        self.w, self.seed = w, seed
        self._cache: dict[Any, Any] = {}

    def inputs(self, lib: str, grad: bool = False) -> Inputs:
        key = (lib, grad)
        if key not in self._cache:
            self._cache[key] = make_inputs(self.w, lib, grad=grad, seed=self.seed)
        return self._cache[key]

    def dense_mask(self) -> np.ndarray | None:
        if "mask" not in self._cache:
            self._cache["mask"] = self.w.dense_mask()
        return self._cache["mask"]

    def torch_mask(self) -> Any:
        """The boolean mask for SDPA, None when ``is_causal`` (or nothing) expresses it."""
        if self.w.causal:
            return None
        m = self.dense_mask()
        if m is None:
            return None
        import torch

        return torch.from_numpy(m)


class Competitor(NamedTuple):
    name: str
    build: Callable[[Workload, str, CaseData], Run]
    backward: bool  # has a forward+backward mode
    materialises: int  # score matrices it holds at once (fwd), 0 for tiled kernels


def naive_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, allowed: np.ndarray | None = None) -> np.ndarray:
    """``softmax(q kᵀ / √d + mask) v`` in plain NumPy: the textbook formula, scores materialised."""
    r = q.shape[-3] // k.shape[-3]
    if r > 1:  # grouped heads: copy each kv head for its query heads (repeat_interleave order)
        k, v = np.repeat(k, r, axis=-3), np.repeat(v, r, axis=-3)
    s = (q @ np.swapaxes(k, -1, -2)) * np.float32(1 / np.sqrt(q.shape[-1]))
    if allowed is not None:
        s = np.where(allowed, s, np.float32(-np.inf))
    p = np.exp(s - s.max(axis=-1, keepdims=True))
    return (p / p.sum(axis=-1, keepdims=True)) @ v


def _grads(out: Any, x: Inputs) -> list[Any]:
    import torch

    return [out, *torch.autograd.grad(out, (x.q, x.k, x.v), x.dout)]


def _qkv(impl: str, lib: str, engine: str | None = None, threads: int | None = None) -> Callable[..., Run]:
    """``qkv.attention`` with ``impl`` on ``lib`` arrays; ``engine`` forces the flash kernel's engine
    (through the internal ``Call``), ``threads`` runs the call with that many torch threads (the
    compiled engine follows torch's count)."""

    def attend(q: Any, k: Any, v: Any, mask: Any) -> Any:
        if engine is None:
            return qkv.attention(q, k, v, mask=mask, impl=impl)
        from .._core import run
        from .._impls import build_call

        return run(build_call(q, k, v, mask=mask, engine=engine), impl).out

    def build(w: Workload, mode: str, data: CaseData) -> Run:
        x = data.inputs(lib, grad=mode == "fwdbwd" and lib == "torch")

        def fwd() -> list[Any]:
            if threads is None:
                return [attend(x.q, x.k, x.v, w.mask)]
            import torch

            saved = torch.get_num_threads()
            torch.set_num_threads(threads)
            try:
                return [attend(x.q, x.k, x.v, w.mask)]
            finally:
                torch.set_num_threads(saved)

        def fwdbwd_torch() -> list[Any]:
            return _grads(attend(x.q, x.k, x.v, w.mask), x)

        def fwdbwd_numpy() -> list[Any]:
            out, lse = qkv.attention(x.q, x.k, x.v, mask=w.mask, impl=impl, return_lse=True)
            grads = qkv.attention_backward(x.dout, x.q, x.k, x.v, out, lse, mask=w.mask, impl=impl)
            return [out, *grads]

        if mode == "fwd":
            return fwd
        return fwdbwd_torch if lib == "torch" else fwdbwd_numpy

    return build


def _sdpa(backend_name: str) -> Callable[[Workload, str, CaseData], Run]:
    def build(w: Workload, mode: str, data: CaseData) -> Run:
        import torch.nn.functional as F
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backend = getattr(SDPBackend, backend_name)
        x = data.inputs("torch", grad=mode == "fwdbwd")
        mask, gqa = data.torch_mask(), w.hkv != w.h

        def run() -> list[Any]:
            with sdpa_kernel(backend):
                out = F.scaled_dot_product_attention(x.q, x.k, x.v, attn_mask=mask, is_causal=w.causal, enable_gqa=gqa)
                return _grads(out, x) if mode == "fwdbwd" else [out]

        return run

    return build


def _numpy(w: Workload, mode: str, data: CaseData) -> Run:
    x = data.inputs("numpy")
    allowed = data.dense_mask()
    return lambda: [naive_attention(x.q, x.k, x.v, allowed)]


def _flex_build(w: Workload, mode: str, data: CaseData) -> Run:
    from ._flex import build

    return build(w, data.inputs("torch"))


COMPETITORS: dict[str, Competitor] = {
    c.name: c
    for c in (
        Competitor("qkv-flash", _qkv("flash", "torch"), True, 0),
        Competitor("qkv-flash-array", _qkv("flash", "torch", engine="array"), True, 0),
        Competitor("qkv-flash-1thread", _qkv("flash", "torch", threads=1), False, 0),
        Competitor("qkv-auto", _qkv("auto", "torch"), True, 0),
        Competitor("qkv-torch", _qkv("torch", "torch"), True, 0),
        Competitor("qkv-reference", _qkv("reference", "torch"), True, 2),
        Competitor("qkv-flash-np", _qkv("flash", "numpy"), True, 0),
        Competitor("qkv-auto-np", _qkv("auto", "numpy"), True, 0),
        Competitor("qkv-reference-np", _qkv("reference", "numpy"), True, 2),
        Competitor("sdpa-flash", _sdpa("FLASH_ATTENTION"), True, 0),
        Competitor("sdpa-math", _sdpa("MATH"), True, 2),
        Competitor("numpy", _numpy, False, 3),
        Competitor("flex", _flex_build, False, 0),
    )
}


def build(name: str, w: Workload, mode: str, data: CaseData) -> Run:
    """The callable for competitor ``name`` on this case; raises ``Unavailable`` with the reason."""
    if name not in COMPETITORS:
        raise ValueError(f"unknown competitor {name!r}; known: {sorted(COMPETITORS)}")
    c = COMPETITORS[name]
    if mode == "fwdbwd" and not c.backward:
        raise Unavailable("forward only")
    held = c.materialises * w.score_bytes() * (2 if mode == "fwdbwd" else 1)
    if held > MATERIALISED_LIMIT:
        raise Unavailable(f"would materialise ~{held / 2**30:.1f} GiB of scores")
    return c.build(w, mode, data)


def to_numpy(x: Any) -> np.ndarray:
    """A NumPy view or copy of an output array (detached from autograd)."""
    if isinstance(x, np.ndarray):
        return x
    return x.detach().cpu().float().numpy() if str(x.dtype) == "torch.bfloat16" else x.detach().cpu().numpy()


def max_abs_diff(a: list[Any], b: list[Any]) -> float:
    """Largest absolute difference over the arrays two candidates returned (common prefix)."""
    return max(float(np.max(np.abs(to_numpy(x) - to_numpy(y)))) for x, y in zip(a, b, strict=False))
