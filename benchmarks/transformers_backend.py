"""qkv as a transformers attention backend against sdpa, eager and compiled flex_attention, on CPU.

Two tiny configs built in code (nothing downloaded): Mistral-style (sliding window 256) and
Llama-style (full causal), GQA 8 query heads over 2 kv heads, head dim 64, 2 layers (``--layers``).
Workloads: prefill of one sequence (4096, 8192 tokens: the forward of the whole model,
``use_cache=False``), decode (32 greedy tokens after a 2048-token prompt: per-token time of the
decode steps) and, with ``--train N``, one training step (forward, language-model loss, backward)
at N tokens. ``--targets`` runs the end-to-end targets of issue 22 and nothing else: 4 layers,
qkv against sdpa, a training step at 2048 (Llama-style), a sliding-window prefill at 4096
(Mistral-style) and 32 greedy tokens after a 1024-token prompt (Llama-style), each also with
``free`` attention (zeros at O(N * D) cost): sdpa's time over free's is the most any attention
kernel can gain end to end there, printed beside qkv's gain.

``--paths`` runs issue 31's "never slower than sdpa inside a model" and nothing else: Llama- and
Mistral-shaped models with head_dim 128 (d=1024, 8/2 heads, ``--layers`` 2, Mistral's window
4096), qkv against sdpa and free attention, at each ``--lengths`` N and ``--dtypes``: ``prefill``
(the forward of N tokens, ``use_cache=False``), ``prefill+1`` (generate one token after N with a
static cache: the prefill writes into a cache longer than the prompt), ``dynamic`` and
``static`` (one decode step after N tokens, the model's forward of one token against a dynamic or
a static cache; the caches grow by one token a round, alike for every backend), ``generate``
(16 greedy tokens after N, static cache) and ``train`` (one training step at N: forward, loss,
backward). ``int8`` and ``int8-static``: the decode step with qkv reading a
``qkv.integrations.transformers.QuantizedCache`` (int8 codes and scales; dynamic, or static
slots) while sdpa and free keep the model's own float cache (issue 31: the int8 step against
sdpa's bf16 step). ``--kinds`` picks among them (all but the int8 ones by default).

``--dtype`` (``--dtypes`` for ``--paths``): ``float32``; ``bfloat16`` (the model's weights in
bfloat16, as ``from_config(..., dtype=torch.bfloat16)``; a training step's backward then runs in
bfloat16 too); ``autocast`` (float32 weights, the forward under ``torch.autocast("cpu",
torch.bfloat16)``, the backward outside it: PyTorch's mixed-precision recipe).

Backends run in interleaved rounds (A B C D, A B C D, ...) so drift and contention hit each
alike; the report gives each backend's median and spread (min-max over rounds) and the ratio of
medians to qkv. ``--clock cpu`` times by the process's CPU time instead of the wall clock (with
``--threads 1`` on a shared machine: the time other processes take from this one is not counted).
``flex_attention`` runs through ``torch.compile`` (transformers' own flex path); its first call
(the compile) is reported separately and excluded. Peak extra memory of one
prefill is measured in a fresh subprocess per backend (``qkv.bench._memory.peak_of``).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/transformers_backend.py --rounds 5
    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/transformers_backend.py --targets --threads 2 --rounds 7
    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/transformers_backend.py --targets --dtype bfloat16 --threads 2
    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/transformers_backend.py --paths --threads 2 --rounds 7
"""

import argparse
import contextlib
import copy
import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

BACKENDS = ("qkv", "sdpa", "flex_attention", "eager")  # and "free": attention at zero cost (--targets, --paths)
MODELS = ("mistral", "llama")
DTYPES = ("float32", "bfloat16", "autocast")
KINDS = ("prefill", "prefill+1", "dynamic", "static", "generate", "train")
QUANTIZED_KINDS = ("int8", "int8-static")  # qkv reads a QuantizedCache; sdpa and free a float one
CLOCK = {"now": time.perf_counter}  # --clock cpu: time.process_time


def config(name: str, layers: int = 2, head_dim: int = 64):
    """Mistral-style (sliding window) or Llama-style, GQA 8 query heads over 2 kv heads.

    ``head_dim`` 64: d=512, window 256 (the default runs, ``--targets``); 128: d=1024, window 4096
    (``--paths``: the shape of Llama and Mistral's attention)."""
    from transformers import LlamaConfig, MistralConfig

    common = dict(
        vocab_size=1000,
        hidden_size=8 * head_dim,
        intermediate_size=16 * head_dim,
        num_hidden_layers=layers,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=0,
    )
    window = 256 if head_dim == 64 else 4096
    return MistralConfig(**common, sliding_window=window) if name == "mistral" else LlamaConfig(**common)


def free_attention(module, query, key, value, attention_mask, **kwargs):
    """Attention that costs (almost) nothing: the bound of any attention kernel's end-to-end gain.

    ``out (B, Lq, H, Dv)`` of zeros that still depends on ``query``, ``key`` and ``value`` (one
    O(N * D) read each), so a training step's backward reaches the q/k/v projections as it would;
    the rest of the model runs as with a real backend. ``sdpa time / free time`` is the most any
    attention can gain end to end on that workload (Amdahl)."""
    zero = (key.sum() + value.sum()) * 0
    return (query * 0 + zero).transpose(1, 2).contiguous(), None


def build(name: str, attn: str, layers: int = 2, dtype: str = "float32", head_dim: int = 64):
    """The model, its weights in bfloat16 for ``dtype="bfloat16"`` (float32 otherwise)."""
    import torch
    from transformers import AttentionInterface, AutoModelForCausalLM

    from qkv.integrations import transformers as qt

    qt.register()
    AttentionInterface.register("free", free_attention)
    torch.manual_seed(0)
    weights = torch.bfloat16 if dtype == "bfloat16" else torch.float32
    cfg = copy.deepcopy(config(name, layers, head_dim))
    return AutoModelForCausalLM.from_config(cfg, attn_implementation=attn, dtype=weights).eval()


def compute(dtype: str):
    """The context a forward runs in: ``torch.autocast`` to bfloat16 for ``dtype="autocast"``."""
    import torch

    return torch.autocast("cpu", dtype=torch.bfloat16) if dtype == "autocast" else contextlib.nullcontext()


def tokens(n: int):
    import torch

    return torch.randint(2, 1000, (1, n), generator=torch.Generator().manual_seed(0))


def timed(work):
    """``work`` as a callable returning the seconds it took (``CLOCK``)."""

    def run():
        t0 = CLOCK["now"]()
        work()
        return CLOCK["now"]() - t0

    return run


def prefill(model, n: int, dtype: str = "float32"):
    """The forward of ``n`` tokens without a cache."""
    import torch

    ids = tokens(n)

    def run():
        with torch.no_grad(), compute(dtype):
            return model(ids, use_cache=False).logits

    return timed(run)


def train_step(model, n: int, dtype: str = "float32"):
    """One training step's forward and backward (the LM loss on random tokens; no optimizer). With
    ``autocast`` the forward and the loss run under autocast, the backward outside it."""
    ids = tokens(n)

    def run():
        model.train()
        model.zero_grad(set_to_none=True)
        with compute(dtype):
            loss = model(ids, labels=ids, use_cache=False).loss
        loss.backward()
        model.eval()

    return timed(run)


def _generate(model, ids, k: int, dtype: str, **kw):
    import torch

    with torch.no_grad(), compute(dtype):
        model.generate(ids, max_new_tokens=k, min_new_tokens=k, do_sample=False, pad_token_id=0, **kw)


def decode(model, prompt: int, tokens_: int, dtype: str = "float32"):
    """Seconds per decode step: generate ``tokens_`` minus generate 1 (the prefill), over ``tokens_ - 1``."""
    ids = tokens(prompt)

    def gen(k):
        t0 = CLOCK["now"]()
        _generate(model, ids, k, dtype)
        return CLOCK["now"]() - t0

    return lambda: (gen(tokens_) - gen(1)) / (tokens_ - 1)


def generate_static(model, n: int, k: int, dtype: str = "float32"):
    """``generate`` of ``k`` greedy tokens after ``n`` with a static cache (``k=1``: prefill+1)."""
    ids = tokens(n)
    return timed(lambda: _generate(model, ids, k, dtype, cache_implementation="static"))


def _cache_kw(model) -> str:
    """The forward's cache argument: ``cache`` from transformers 5.24 (``past_key_values`` before)."""
    import inspect

    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def step(model, n: int, cache: str, steps: int, dtype: str = "float32"):
    """One decode step after ``n`` tokens: the model's forward of one token against a ``dynamic``
    or ``static`` cache (room for ``steps`` more), filled by a prefill here, outside the timing.
    Each call appends one token, so the cache grows alike for every backend of a round. ``int8``
    / ``int8-static``: qkv's ``QuantizedCache`` for the qkv model, the float one for the others."""
    import torch
    from transformers import DynamicCache, StaticCache

    from qkv.integrations.transformers import QuantizedCache

    ids = tokens(n)
    static = cache in ("static", "int8-static")
    if cache in QUANTIZED_KINDS and model.config._attn_implementation == "qkv":
        kv = QuantizedCache(model.config, dtype="int8", max_cache_len=n + steps if static else None)
    elif static:
        kv = StaticCache(config=model.config, max_cache_len=n + steps)
    else:
        kv = DynamicCache(config=model.config)
    with torch.no_grad(), compute(dtype):
        nxt = [model(ids, use_cache=True, **{_cache_kw(model): kv}).logits[:, -1:].argmax(-1)]

    def run():
        with torch.no_grad(), compute(dtype):
            nxt[0] = model(nxt[0], use_cache=True, **{_cache_kw(model): kv}).logits[:, -1:].argmax(-1)

    return timed(run)


def _memory_child(spec: str) -> None:
    from qkv.bench._memory import peak_of

    s = json.loads(spec)
    import torch

    torch.set_num_threads(1)
    model = build(s["model"], s["attn"], s["layers"])
    prefill(model, 256)()  # warm up: libraries, thread pools, compile
    ids = tokens(s["n"])

    def run():
        with torch.no_grad():
            return [model(ids, use_cache=False).logits]

    print(json.dumps(peak_of(run)))


def memory(model: str, attn: str, n: int, layers: int) -> float:
    """Peak extra MiB of one prefill, in a fresh subprocess."""
    spec = json.dumps({"model": model, "attn": attn, "n": n, "layers": layers})
    res = subprocess.run(
        [sys.executable, __file__, "--memory-child", spec], capture_output=True, text=True, check=True, timeout=1800
    )
    r = json.loads(res.stdout.strip().splitlines()[-1])
    return (r["peak"] - r["baseline"]) / 2**20


def measure(label: str, runs: dict, rounds: int) -> dict:
    """Interleaved rounds of ``runs`` (backend -> callable returning seconds); prints each backend's
    median and spread, and beside sdpa's gain the free bound when both ran. Returns the times."""
    times = {attn: [] for attn in runs}
    for _ in range(rounds):
        for attn, f in runs.items():
            times[attn].append(f())
    base = statistics.median(times["qkv"]) if "qkv" in times else None
    for attn, ts in times.items():
        med = statistics.median(ts)
        ratio = f"{med / base:.2f}x qkv's time" if base else ""
        print(f"{label} {attn}: median {med * 1e3:.2f} ms (min {min(ts) * 1e3:.2f}, max {max(ts) * 1e3:.2f}) {ratio}")
    if "free" in times and "sdpa" in times:
        bound = statistics.median(times["sdpa"]) / statistics.median(times["free"])
        gain = statistics.median(times["sdpa"]) / base if base else float("nan")
        print(f"{label}: qkv gains {gain:.2f}x over sdpa; free attention would gain {bound:.2f}x", flush=True)
    return times


def warmed(label: str, makers: dict) -> dict:
    """Each backend's callable after one warm-up call (flex_attention compiles there); a backend
    whose warm-up fails is reported and left out."""
    runs = {}
    for attn, make in makers.items():
        t0 = time.perf_counter()
        try:
            f = make()
            f()
        except Exception as e:  # e.g. inductor failing to compile flex decoding on this CPU
            print(f"{label} {attn}: failed ({type(e).__name__}: {str(e).splitlines()[0][:120]})")
            continue
        runs[attn] = f
        if attn == "flex_attention":
            print(f"{label}: flex_attention warm-up {time.perf_counter() - t0:.1f} s")
    return runs


def paths(a) -> None:
    """Issue 31's paths: every kind at every length and dtype, Llama and Mistral, head_dim 128."""
    budget = 2 * (a.rounds + 2) + 8  # decode steps each cache may take
    for name in a.models:
        for dtype in a.dtypes:
            models = {attn: build(name, attn, a.layers, dtype, head_dim=128) for attn in a.backends}
            for n in a.lengths:
                for kind in a.kinds:
                    label = f"{name} {dtype} {kind} {n}"

                    def maker(m, kind=kind, n=n, dtype=dtype):
                        if kind == "prefill":
                            return lambda: prefill(m, n, dtype)
                        if kind == "train":
                            return lambda: train_step(m, n, dtype)
                        if kind in ("dynamic", "static", *QUANTIZED_KINDS):
                            return lambda: step(m, n, kind, budget, dtype)
                        return lambda: generate_static(m, n, 1 if kind == "prefill+1" else 16, dtype)

                    runs = warmed(label, {attn: maker(m) for attn, m in models.items()})
                    measure(label, runs, a.rounds)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--models", nargs="+", default=list(MODELS))
    p.add_argument("--backends", nargs="+", default=list(BACKENDS))
    p.add_argument("--prefill", nargs="*", type=int, default=[4096, 8192])
    p.add_argument("--eager-max", type=int, default=4096, help="skip eager above this length (N x N scores)")
    p.add_argument("--decode-prompt", type=int, default=2048)
    p.add_argument("--decode-tokens", type=int, default=32, help="0: no decode rows")
    p.add_argument("--train", nargs="*", type=int, default=[], help="training-step lengths (forward + backward)")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (qkv follows it)")
    p.add_argument("--dtype", choices=DTYPES, default="float32", help="weights / compute dtype (see above)")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    p.add_argument("--targets", action="store_true", help="only issue 22's end-to-end targets (see above)")
    p.add_argument("--paths", action="store_true", help="only issue 31's paths (see above)")
    p.add_argument("--lengths", nargs="+", type=int, default=[1024, 4096, 16384], help="--paths: N")
    p.add_argument("--dtypes", nargs="+", choices=DTYPES, default=["float32", "bfloat16"], help="--paths")
    p.add_argument("--kinds", nargs="+", choices=KINDS + QUANTIZED_KINDS, default=list(KINDS), help="--paths")
    p.add_argument("--memory", action="store_true", help="also measure peak memory of one prefill")
    p.add_argument("--memory-child", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.memory_child:
        _memory_child(a.memory_child)
        return
    import torch

    from qkv._info import fresh_line

    torch.set_num_threads(a.threads)
    print(f"# {fresh_line()}", flush=True)  # qkv.info()'s line: CPU, ISA path, engines, threads, versions
    CLOCK["now"] = time.process_time if a.clock == "cpu" else time.perf_counter
    print(f"# torch {torch.__version__}, threads {torch.get_num_threads()}, clock {a.clock}, dtype {a.dtype}")
    print(f"# loadavg before {open('/proc/loadavg').read().strip()}")
    if a.paths:
        a.backends = ["qkv", "sdpa", "free"] if a.backends == list(BACKENDS) else a.backends
        paths(a)
        print(f"# loadavg after {open('/proc/loadavg').read().strip()}")
        return
    if a.targets:
        a.layers, a.backends, a.rounds = 4, ["qkv", "sdpa", "free"], max(a.rounds, 5)
        plan = {"llama": ([], [2048], True), "mistral": ([4096], [], False)}
        a.decode_prompt, a.decode_tokens = 1024, 32
    else:
        plan = {name: (a.prefill, a.train, a.decode_tokens > 1) for name in a.models}
    for name, (prefills, trains, with_decode) in plan.items():
        models = {attn: build(name, attn, a.layers, a.dtype) for attn in a.backends}
        if "flex_attention" in models:
            t0 = time.perf_counter()
            prefill(models["flex_attention"], 512)()
            print(f"{name}: flex_attention first call (compile) {time.perf_counter() - t0:.1f} s")
        work = [(f"prefill {n}", n, prefill) for n in prefills] + [(f"train {n}", n, train_step) for n in trains]
        work += [("decode", None, None)] if with_decode else []
        for label, n, make in work:
            makers = {}
            for attn, m in models.items():
                if n is not None and attn == "eager" and n > a.eager_max:
                    continue
                if make is None:
                    makers[attn] = lambda m=m: decode(m, a.decode_prompt, a.decode_tokens, a.dtype)
                else:
                    makers[attn] = lambda m=m, make=make, n=n: make(m, n, a.dtype)
            label = f"{name} {label}" + ("" if n is not None else " (per token)")
            measure(label, warmed(label, makers), a.rounds)
            if a.memory and make is prefill:
                for attn in makers:
                    print(f"{label} {attn}: peak extra {memory(name, attn, n, a.layers):.0f} MiB", flush=True)
    print(f"# loadavg after {open('/proc/loadavg').read().strip()}")


if __name__ == "__main__":
    main()
