"""Spawned process groups for the distributed tests: one ``spawn`` per world size, many cases each.

``run(world_size, job, payload)`` starts ``world_size`` processes with the ``spawn`` start
method, joins them into a gloo group on ``127.0.0.1`` (a fresh free port), runs ``JOBS[job]``
in each and returns every rank's result, in rank order. A rank that raises ends the run at
once: the other ranks are terminated (they may be blocked in a collective waiting for it) and
the parent raises ``RankError`` carrying that rank's traceback. A deadline bounds the whole run.

The checks themselves compare against references that do not involve qkv's distributed code:
torch's own ``scaled_dot_product_attention`` (float64, autograd for the gradients) and the
float64 loop oracle, both on the whole (gathered) tensors.
"""

import queue as queue_mod
import socket
import time
import traceback
from datetime import timedelta

import numpy as np

import oracle as O

TIMEOUT = 60.0


class RankError(AssertionError):
    """A spawned rank raised, died or ran out of time."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank, world_size, port, job, payload, results):
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=TIMEOUT),
        )
        try:
            results.put((rank, "ok", JOBS[job](rank, world_size, payload)))
        finally:
            dist.destroy_process_group()
    except BaseException:
        results.put((rank, "error", traceback.format_exc()))


def run(world_size, job, payload=None, timeout=TIMEOUT):
    """Every rank's result of ``JOBS[job](rank, world_size, payload)``; raises RankError on any failure."""
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=_entry, args=(r, world_size, port, job, payload, results), daemon=True)
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    got = {}
    deadline = time.monotonic() + timeout
    try:
        while len(got) < world_size:
            try:
                rank, status, value = results.get(timeout=0.1)
            except queue_mod.Empty:
                dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in got]
                if dead:
                    raise RankError(f"rank {dead[0]} died with exit code {procs[dead[0]].exitcode}") from None
                if time.monotonic() > deadline:
                    raise RankError(
                        f"ranks {sorted(set(range(world_size)) - set(got))} did not finish within {timeout:.0f} s"
                    ) from None
                continue
            if status == "error":
                raise RankError(f"rank {rank} raised:\n{value}")
            got[rank] = value
    finally:
        for p in procs:
            p.join(timeout=5 if len(got) == world_size else 0)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()
        results.close()
    return [got[r] for r in range(world_size)]


# --------------------------------------------------------------------------- jobs


class CountBytes:
    """Counts the bytes each call of torch.distributed's P2P batch and all-to-all sends to other ranks."""

    def __init__(self, dist):
        self.dist, self.calls = dist, []

    def __enter__(self):
        d = self.dist
        self.saved = (d.batch_isend_irecv, d.all_to_all_single)

        def batch(ops):
            self.calls.append(sum(op.tensor.numel() * op.tensor.element_size() for op in ops if op.op is d.isend))
            return self.saved[0](ops)

        def a2a(output, input, *args, group=None, **kw):
            w = d.get_world_size(group)
            self.calls.append(input.numel() * input.element_size() * (w - 1) // w)
            return self.saved[1](output, input, *args, group=group, **kw)

        d.batch_isend_irecv, d.all_to_all_single = batch, a2a
        return self

    def __exit__(self, *exc):
        self.dist.batch_isend_irecv, self.dist.all_to_all_single = self.saved


def _reference(q, k, v, causal):
    """torch SDPA in float64 on the whole tensors (GQA by repeat_interleave, mask from the oracle)."""
    import torch
    import torch.nn.functional as F

    r = q.shape[-3] // k.shape[-3]
    k, v = k.repeat_interleave(r, dim=-3), v.repeat_interleave(r, dim=-3)
    mask = torch.from_numpy(O.causal_allowed(q.shape[-2], k.shape[-2])) if causal else None
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def _groups(dist, rank, world_size, kind):
    """The group a case runs on: None (world), "pairs" ({0,1}, {2,3}, ...) or "single" ({r})."""
    if kind is None:
        return None, world_size
    size = 2 if kind == "pairs" else 1
    mine = None
    for start in range(0, world_size, size):  # every rank creates every group, in the same order
        g = dist.new_group(list(range(start, start + size)))
        if start <= rank < start + size:
            mine = g
    return mine, size


def check_attention(rank, world_size, cases):
    """Run each case; return {name: {quantity: max error, ...}} for the parent to judge."""
    import torch
    import torch.distributed as dist

    from qkv import complexity
    from qkv.distributed import gather_sequence, ring_attention, shard_sequence, simulate_ring, ulysses_attention

    report = {}
    for case in cases:
        c = {
            "b": 1,
            "dv": None,
            "causal": False,
            "layout": "contiguous",
            "dtype": "float64",
            "group": None,
            "nk": None,
            **case,
        }
        group, w = _groups(dist, rank, world_size, c["group"])
        nq, dk = c["n"], c["dk"]
        nk, dv = c["nk"] or nq, c["dv"] or dk
        rng = np.random.default_rng(c["seed"])  # the same global tensors on every rank
        arrays = [
            rng.standard_normal(s)
            for s in (
                (c["b"], c["h"], nq, dk),
                (c["b"], c["hkv"], nk, dk),
                (c["b"], c["hkv"], nk, dv),
                (c["b"], c["h"], nq, dv),
            )
        ]
        dtype = getattr(torch, c["dtype"])
        q, k, v = (torch.tensor(a, dtype=dtype, requires_grad=True) for a in arrays[:3])
        dout = torch.tensor(arrays[3], dtype=dtype)
        layout = c["layout"]
        shards = [shard_sequence(x, group, layout) for x in (q, k, v)]
        with CountBytes(dist) as fwd:
            if c["fn"] == "ring":
                out_s = ring_attention(*shards, group=group, causal=c["causal"], layout=layout)
            else:
                out_s = ulysses_attention(*shards, group=group, causal=c["causal"])
        out = gather_sequence(out_s, group, layout)  # differentiable: its backward hands each rank its slice
        with CountBytes(dist) as bwd:
            out.backward(dout)
        for x in (q, k, v):  # each rank holds its shards' gradients: their sum is the whole gradient
            dist.all_reduce(x.grad, group=group)
        # references on the whole tensors, in float64
        q64, k64, v64 = (torch.tensor(a, requires_grad=True) for a in arrays[:3])
        ref = _reference(q64, k64, v64, c["causal"])
        ref.backward(torch.tensor(arrays[3]))
        golden = O.attention_oracle(*arrays[:3], O.causal_allowed(nq, nk) if c["causal"] else None)[0]
        err = {"out_vs_oracle": float(np.abs(out.detach().double().numpy() - golden).max())}
        for name, x, r in (
            ("out", out, ref),
            ("dq", q.grad, q64.grad),
            ("dk", k.grad, k64.grad),
            ("dv", v.grad, v64.grad),
        ):
            err[name] = float((x.detach().double() - r.detach()).abs().max())
        if c["dtype"] != "float64":  # the same computation by torch SDPA in this dtype: the baseline error
            qb, kb, vb = (torch.tensor(a, dtype=dtype, requires_grad=True) for a in arrays[:3])
            base = _reference(qb, kb, vb, c["causal"])
            base.backward(dout)
            for name, x, r in (
                ("out", base, ref),
                ("dq", qb.grad, q64.grad),
                ("dk", kb.grad, k64.grad),
                ("dv", vb.grad, v64.grad),
            ):
                err["baseline_" + name] = float((x.detach().double() - r.detach()).abs().max())
        if c["fn"] == "ring":
            sim = simulate_ring(q.detach(), k.detach(), v.detach(), w, c["causal"], layout=layout)
            err["vs_simulator"] = float((sim.out - out.detach()).abs().max())
            my_steps = [s for s in sim.steps if s.rank == dist.get_rank(group)]
            err["simulated_bytes"] = sum(s.bytes_sent for s in my_steps)
        pred = complexity.communication(
            nq,
            d_k=dk,
            d_v=dv,
            heads=c["h"],
            kv_heads=c["hkv"],
            batch=c["b"],
            dtype=c["dtype"],
            world_size=w,
            scheme=c["fn"],
            causal=c["causal"],
            layout=layout,
            backward=True,
            n_k=nk,
        )
        fwd_pred = complexity.communication(
            nq,
            d_k=dk,
            d_v=dv,
            heads=c["h"],
            kv_heads=c["hkv"],
            batch=c["b"],
            dtype=c["dtype"],
            world_size=w,
            scheme=c["fn"],
            causal=c["causal"],
            layout=layout,
            n_k=nk,
        )
        err["bytes"] = (sum(fwd.calls), fwd_pred.bytes_per_rank, sum(fwd.calls) + sum(bwd.calls), pred.bytes_per_rank)
        report[case["name"]] = err
    return report


def expect_errors(rank, world_size, payload):
    """Bad calls on a live group, the same on every rank: each raises the named error type before any
    data moves (the ranks exchange only their call signatures, ``qkv.distributed._agree``)."""
    import torch

    from qkv.distributed import gather_sequence, ring_attention, shard_sequence, ulysses_attention

    x = torch.zeros(1, 3, 6, 4)
    calls = {
        "ulysses_heads": lambda: ulysses_attention(x, x, x),
        "ulysses_kv_heads": lambda: ulysses_attention(torch.zeros(1, 4, 6, 4), x[:, :1], x[:, :1]),
        "zigzag_odd_shard": lambda: ring_attention(
            torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4), torch.zeros(1, 2, 3, 4), layout="zigzag"
        ),
        "shard_not_divisible": lambda: shard_sequence(torch.zeros(1, 2, 5, 4)),
        "shard_zigzag_not_divisible": lambda: shard_sequence(torch.zeros(1, 2, 6, 4), layout="zigzag"),
        "unknown_layout": lambda: ring_attention(x, x, x, layout="striped"),
        "gather_numpy": lambda: gather_sequence(np.zeros((2, 4))),
    }
    out = {}
    for name, call in calls.items():
        try:
            call()
        except Exception as e:
            out[name] = (type(e).__name__, str(e))
        else:
            out[name] = ("no error", "")
    return out


def raise_on_rank1(rank, world_size, payload):
    """Rank 1 raises; rank 0 enters the ring and would wait for rank 1 forever."""
    import torch

    from qkv.distributed import ring_attention

    if rank == 1:
        raise ValueError("rank 1 exploded on purpose")
    x = torch.zeros(1, 1, 4, 4)
    time.sleep(0.5)
    return ring_attention(x, x, x).sum().item()


def _disagreeing_call(args):
    """Run one call of a mismatch row with this rank's ``args`` (shapes, dtype, flags)."""
    import torch

    from qkv.distributed import gather_sequence, ring_attention, ulysses_attention

    dtype = getattr(torch, args.get("dtype", "float64"))
    grad = args.get("requires_grad", False)
    t = {
        name: torch.zeros(args[name], dtype=dtype, requires_grad=grad) for name in ("q", "k", "v", "x") if name in args
    }
    kw = {key: args[key] for key in ("causal", "layout", "scale") if key in args}
    if args["fn"] == "gather":
        return gather_sequence(t["x"], **kw)
    fn = ring_attention if args["fn"] == "ring" else ulysses_attention
    return fn(t["q"], t["k"], t["v"], **kw)


def disagree(rank, world_size, rows):
    """Each row: ranks in ``row["odd_ranks"]`` call with ``row["odd"]`` merged over ``row["base"]``,
    the others with ``row["base"]``. Returns {id: (error type, message, seconds)} for this rank;
    then checks that the group still works (a ring call equal to qkv.attention)."""
    import torch

    import qkv
    from qkv.distributed import gather_sequence, ring_attention, shard_sequence

    out = {}
    for row in rows:
        args = {**row["base"], **(row["odd"] if rank in row["odd_ranks"] else {})}
        start = time.monotonic()
        try:
            got = _disagreeing_call(args)
        except Exception as e:
            out[row["id"]] = (type(e).__name__, str(e), time.monotonic() - start)
        else:
            out[row["id"]] = ("no error", f"returned {tuple(got.shape)}", time.monotonic() - start)
    rng = np.random.default_rng(0)  # the same tensors on every rank
    q, k, v = (torch.tensor(rng.standard_normal((1, 2, 8 * world_size, 4))) for _ in range(3))
    got = ring_attention(*(shard_sequence(x) for x in (q, k, v)), causal=True)
    err = float((gather_sequence(got) - qkv.attention(q, k, v, causal=True)).abs().max())
    return {"rows": out, "afterwards": err}


def suite(rank, world_size, payload):
    """``check_attention`` on ``payload["cases"]``, then (if asked) ``expect_errors`` and ``disagree``:
    one spawn for all."""
    report = {"cases": check_attention(rank, world_size, payload["cases"])}
    if payload.get("errors"):
        report["errors"] = expect_errors(rank, world_size, None)
    if payload.get("disagree"):
        report["disagree"] = disagree(rank, world_size, payload["disagree"])
    return report


JOBS = {"suite": suite, "raise_on_rank1": raise_on_rank1}
