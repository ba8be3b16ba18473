"""Two builds of the compiled kernel, interleaved (A B A B ...): the median and spread of the
per-pair time ratios B / A on the same inputs, in one run on one machine.

Each build runs in its own worker process (``QKV_NATIVE_LIB`` points ``qkv._native`` at a module
built elsewhere); the parent asks them in turn, so both see the same machine load. To compare a
commit's kernel against the installed one, build the commit into a separate directory first:

    git archive <commit> CMakeLists.txt src/qkv/_native | tar -x -C /tmp/old
    cmake -S /tmp/old -B /tmp/old/build -DPython_EXECUTABLE=$PWD/.venv/bin/python && cmake --build /tmp/old/build
    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/ab_kernel.py --a $(find /tmp/old/build -name '_ext*.so')

``--b`` defaults to the installed module; ``--cases bwd,decode`` runs the cases whose names hold
one of those strings. Ratio > 1: B is slower. Float32, B=1, H=8, D=64 unless the case names another.
When the commits differ in the kernel's arguments too, ``--a-src /tmp/old/src`` runs A's worker on
that commit's own Python package (``git archive <commit> src/qkv`` as above).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

CASES = {  # name -> (Nq, Nk, causal, backward, softcap, Hkv[, D = 64[, scale]])
    "dense fwd N=4096": (4096, 4096, False, False, None, 8),
    "dense fwd N=2048 D=128": (2048, 2048, False, False, None, 8, 128),
    "dense fwd N=2048 D=256": (2048, 2048, False, False, None, 8, 256),
    "causal fwd+bwd N=1024 D=128": (1024, 1024, True, True, None, 8, 128),
    "decode rows fwd+bwd Nq=16 Nk=8192": (16, 8192, False, True, None, 8),
    "large scores fwd+bwd N=1024 scale=64": (1024, 1024, True, True, None, 8, 64, 64.0),
    "causal fwd N=8192": (8192, 8192, True, False, None, 8),
    "dense fwd+bwd N=2048": (2048, 2048, False, True, None, 8),
    "causal GQA 8/2 fwd+bwd N=2048": (2048, 2048, True, True, None, 2),
    "softcap fwd N=4096": (4096, 4096, False, False, 50.0, 8),
    "softcap fwd+bwd N=2048": (2048, 2048, False, True, 50.0, 8),
    "decode Nq=1 Nk=65536": (1, 65536, False, False, None, 8),
    "tile step, 1 thread, L1": None,  # _microbench(3): S, softmax, P V and the O update of one 16 x 128 tile
}


def worker() -> None:
    """Reads case names on stdin, answers each with the best of 3 timings (seconds) on stdout."""
    src = os.environ.get("QKV_AB_SRC")
    if src:  # A's own package first; an editable install's import finder would otherwise come first
        sys.meta_path[:] = [f for f in sys.meta_path if not type(f).__module__.startswith("_editable")]
        sys.path.insert(0, src)
    import torch

    import qkv
    from qkv import scores
    from qkv._impls import build_call

    g = torch.Generator().manual_seed(0)
    made = {}
    for line in sys.stdin:
        name = line.strip()
        if CASES[name] is None:  # seconds per GFLOP, best of 3
            print(json.dumps(1 / max(qkv._native._ext._microbench(3, 20000) for _ in range(3))), flush=True)
            continue
        nq, nk, causal, bwd, cap, hkv, *rest = CASES[name]
        d, scale = (rest[0] if rest else 64), (rest[1] if len(rest) > 1 else None)
        kw = {"causal": causal, "score_mod": None if cap is None else scores.softcap(cap), "scale": scale}
        if name not in made:
            made[name] = [torch.randn(1, h, n, d, generator=g) for h, n in ((8, nq), (hkv, nk), (hkv, nk), (8, nq))]
        q, k, v, do = made[name]
        best = float("inf")
        for _ in range(3):
            t = [x.clone().requires_grad_(bwd) for x in (q, k, v)]
            t0 = time.perf_counter()
            out = qkv._core.run(build_call(*t, engine="native", **kw), "flash").out
            if bwd:
                out.backward(do)
            best = min(best, time.perf_counter() - t0)
        print(json.dumps(best), flush=True)


def start(lib: str | None, src: str | None = None) -> subprocess.Popen:
    env = dict(os.environ)
    if lib:
        env["QKV_NATIVE_LIB"] = lib
    if src:
        env["QKV_AB_SRC"] = src
    return subprocess.Popen(
        [sys.executable, __file__, "--worker"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )


def ask(p: subprocess.Popen, name: str) -> float:
    assert p.stdin is not None and p.stdout is not None
    p.stdin.write(name + "\n")
    p.stdin.flush()
    return float(json.loads(p.stdout.readline()))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--a", help="the baseline _ext*.so (required)")
    ap.add_argument("--b", default=None, help="the candidate _ext*.so (default: the installed module)")
    ap.add_argument("--a-src", default=None, help="the directory holding A's qkv package (default: the installed)")
    ap.add_argument("--pairs", type=int, default=9)
    ap.add_argument("--cases", default="", help="comma-separated substrings of the case names to run (default: all)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker()
        return
    if not args.a:
        ap.error("--a (the baseline module) is required")
    import numpy as np

    from qkv._info import fresh_line

    print(fresh_line(), flush=True)  # qkv.info()'s line: CPU, ISA path, engines, threads, versions

    a, b = start(args.a, args.a_src), start(args.b)
    print(f"A = {args.a}\nB = {args.b or 'installed'}\nOMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}")
    wanted = [c for c in args.cases.split(",") if c]
    for name in (n for n in CASES if not wanted or any(w in n for w in wanted)):
        ask(a, name), ask(b, name)  # warm-up
        ratios, ta, tb = [], [], []
        for i in range(args.pairs):
            first, second = (a, b) if i % 2 == 0 else (b, a)  # alternate which goes first
            x = ask(first, name)
            y = ask(second, name)
            t_a, t_b = (x, y) if first is a else (y, x)
            ta.append(t_a), tb.append(t_b), ratios.append(t_b / t_a)
        r = np.array(ratios)
        print(
            f"{name:24s} A {np.median(ta) * 1e3:8.2f} ms  B {np.median(tb) * 1e3:8.2f} ms  "
            f"B/A median {np.median(r):.3f} (range {r.min():.3f}-{r.max():.3f})",
            flush=True,
        )
    for p in (a, b):
        assert p.stdin is not None
        p.stdin.close()
        p.wait()


if __name__ == "__main__":
    main()
