"""Jitted JAX: qkv (the compiled kernel as an XLA custom call) against ``jax.nn.dot_product_attention``.

Two workloads (issue 24's targets), float32, B = 1, D = 64, both sides under ``jax.jit`` and
timed in interleaved rounds (qkv, XLA, qkv, XLA, ...; medians and min-max, ratio = XLA's median
time over qkv's):

- causal, N = 4096, H = 8: forward + backward (``jax.value_and_grad`` of a weighted sum), and
  the forward alone;
- sliding window 256 (causal), N = 8192, H = 8, forward: XLA with ``local_window_size=(255, 0)``.

Memory: the compiled programs' temporary buffers (``memory_analysis().temp_size_in_bytes``),
which hold XLA's ``N x N`` scores and none of qkv's.

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/jax_jit.py [--rounds 9] [--quick]
"""

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "2")


def cpu() -> str:
    model = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    flags = next((ln.split(":", 1)[1].split() for ln in open("/proc/cpuinfo") if ln.startswith("flags")), [])
    isa = [f for f in ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile") if f in flags]
    return f"{model}; {' '.join(isa)}"


def timed(f, *args) -> float:
    import jax

    t0 = time.perf_counter()
    jax.block_until_ready(f(*args))
    return time.perf_counter() - t0


def interleave(a, b, args, rounds: int) -> tuple[list[float], list[float]]:
    timed(a, *args), timed(b, *args)  # compile and warm up
    ta, tb = [], []
    for _ in range(rounds):
        ta.append(timed(a, *args))
        tb.append(timed(b, *args))
    return ta, tb


def line(name: str, ta: list[float], tb: list[float]) -> str:
    ma, mb = statistics.median(ta), statistics.median(tb)
    return (
        f"| {name} | {ma * 1e3:.1f} ({min(ta) * 1e3:.1f}–{max(ta) * 1e3:.1f}) "
        f"| {mb * 1e3:.1f} ({min(tb) * 1e3:.1f}–{max(tb) * 1e3:.1f}) | {mb / ma:.2f}× |"
    )


def temp_mib(f, *args) -> float:
    return f.lower(*args).compile().memory_analysis().temp_size_in_bytes / 2**20


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=9)
    p.add_argument("--quick", action="store_true", help="N / 4 (a smoke run)")
    a = p.parse_args()
    import jax
    import jax.numpy as jnp
    import numpy as np

    import qkv
    from qkv import masks
    from qkv._info import fresh_line

    div = 4 if a.quick else 1
    print(f"# {fresh_line()}", flush=True)  # qkv.info()'s line: CPU, ISA path, engines, threads, versions
    print(f"# {cpu()}; jax {jax.__version__}; OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}")
    print(f"# loadavg before: {open('/proc/loadavg').read().strip()}; command: python {' '.join(sys.argv)}")
    print("| workload | qkv ms (min–max) | XLA ms (min–max) | XLA / qkv |")
    print("|---|---:|---:|---:|")
    r = np.random.default_rng(0)

    def arrays(n: int, h: int):  # qkv's (B, H, N, D) and XLA's (B, N, H, D) of the same numbers
        x = [jnp.asarray(r.standard_normal((1, h, n, 64)), jnp.float32) for _ in range(4)]
        return x, [jnp.swapaxes(t, 1, 2) for t in x]

    n = 4096 // div
    (q, k, v, w), (qx, kx, vx, wx) = arrays(n, 8)

    def ours(q, k, v, w):
        return jnp.sum(qkv.attention(q, k, v, causal=True) * w)

    def xla(q, k, v, w):
        return jnp.sum(jax.nn.dot_product_attention(q, k, v, is_causal=True) * w)

    both = jax.jit(jax.value_and_grad(ours, argnums=(0, 1, 2)))
    both_x = jax.jit(jax.value_and_grad(xla, argnums=(0, 1, 2)))
    got, want = both(q, k, v, w), both_x(qx, kx, vx, wx)
    err = float(jnp.abs(got[1][0] - jnp.swapaxes(want[1][0], 1, 2)).max())
    ta, tb = [], []
    timed(both, q, k, v, w), timed(both_x, qx, kx, vx, wx)
    for _ in range(a.rounds):
        ta.append(timed(both, q, k, v, w))
        tb.append(timed(both_x, qx, kx, vx, wx))
    print(line(f"causal N={n} H=8 fwd+bwd (max |dq diff| {err:.1e})", ta, tb))
    fwd = jax.jit(lambda q, k, v: qkv.attention(q, k, v, causal=True))
    fwd_x = jax.jit(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True))
    ta, tb = [], []
    timed(fwd, q, k, v), timed(fwd_x, qx, kx, vx)
    for _ in range(a.rounds):
        ta.append(timed(fwd, q, k, v))
        tb.append(timed(fwd_x, qx, kx, vx))
    print(line(f"causal N={n} H=8 fwd", ta, tb))
    print(
        f"# temp buffers, fwd+bwd: qkv {temp_mib(both, q, k, v, w):.1f} MiB, "
        f"XLA {temp_mib(both_x, qx, kx, vx, wx):.1f} MiB (scores: {8 * n * n * 4 / 2**20:.0f} MiB)"
    )

    n = 8192 // div
    (q, k, v, _), (qx, kx, vx, _) = arrays(n, 8)
    win = jax.jit(lambda q, k, v: qkv.attention(q, k, v, mask=masks.sliding_window(256)))
    win_x = jax.jit(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True, local_window_size=(255, 0)))
    err = float(jnp.abs(win(q, k, v) - jnp.swapaxes(win_x(qx, kx, vx), 1, 2)).max())
    ta, tb = [], []
    timed(win, q, k, v), timed(win_x, qx, kx, vx)
    for _ in range(max(3, a.rounds // 2)):
        ta.append(timed(win, q, k, v))
        tb.append(timed(win_x, qx, kx, vx))
    print(line(f"sliding window 256 N={n} H=8 fwd (max |diff| {err:.1e})", ta, tb))
    print(f"# loadavg after: {open('/proc/loadavg').read().strip()}")


if __name__ == "__main__":
    main()
