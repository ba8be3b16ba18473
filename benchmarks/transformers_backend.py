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

Backends run in interleaved rounds (A B C D, A B C D, ...) so drift and contention hit each
alike; the report gives each backend's median and spread (min-max over rounds) and the ratio of
medians to qkv. ``flex_attention`` runs through ``torch.compile`` (transformers' own flex path);
its first call (the compile) is reported separately and excluded. Peak extra memory of one
prefill is measured in a fresh subprocess per backend (``qkv.bench._memory.peak_of``).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/transformers_backend.py --rounds 5
    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/transformers_backend.py --targets --threads 2 --rounds 7
"""

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

BACKENDS = ("qkv", "sdpa", "flex_attention", "eager")  # and "free": attention at zero cost (--targets)
MODELS = ("mistral", "llama")


def config(name: str, layers: int = 2):
    from transformers import LlamaConfig, MistralConfig

    common = dict(
        vocab_size=1000,
        hidden_size=512,
        intermediate_size=1024,
        num_hidden_layers=layers,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=16384,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=0,
    )
    return MistralConfig(**common, sliding_window=256) if name == "mistral" else LlamaConfig(**common)


def free_attention(module, query, key, value, attention_mask, **kwargs):
    """Attention that costs (almost) nothing: the bound of any attention kernel's end-to-end gain.

    ``out (B, Lq, H, Dv)`` of zeros that still depends on ``query``, ``key`` and ``value`` (one
    O(N * D) read each), so a training step's backward reaches the q/k/v projections as it would;
    the rest of the model runs as with a real backend. ``sdpa time / free time`` is the most any
    attention can gain end to end on that workload (Amdahl)."""
    zero = (key.sum() + value.sum()) * 0
    return (query * 0 + zero).transpose(1, 2).contiguous(), None


def build(name: str, attn: str, layers: int = 2):
    import torch
    from transformers import AttentionInterface, AutoModelForCausalLM

    from qkv.integrations import transformers as qt

    qt.register()
    AttentionInterface.register("free", free_attention)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(copy.deepcopy(config(name, layers)), attn_implementation=attn).eval()


def prefill(model, n: int):
    import torch

    ids = torch.randint(2, 1000, (1, n), generator=torch.Generator().manual_seed(0))

    def run():
        with torch.no_grad():
            return [model(ids, use_cache=False).logits]

    return run


def train_step(model, n: int):
    """One training step's forward and backward (the LM loss on random tokens; no optimizer)."""
    import torch

    ids = torch.randint(2, 1000, (1, n), generator=torch.Generator().manual_seed(0))

    def run():
        model.train()
        model.zero_grad(set_to_none=True)
        model(ids, labels=ids, use_cache=False).loss.backward()
        model.eval()

    return run


def decode(model, prompt: int, tokens: int):
    """Seconds per decode step: generate ``tokens`` minus generate 1 (the prefill), over ``tokens - 1``."""
    import torch

    ids = torch.randint(2, 1000, (1, prompt), generator=torch.Generator().manual_seed(0))

    def gen(k):
        t0 = time.perf_counter()
        with torch.no_grad():
            model.generate(ids, max_new_tokens=k, min_new_tokens=k, do_sample=False, pad_token_id=0)
        return time.perf_counter() - t0

    return lambda: (gen(tokens) - gen(1)) / (tokens - 1)


def _memory_child(spec: str) -> None:
    from qkv.bench._memory import peak_of

    s = json.loads(spec)
    import torch

    torch.set_num_threads(1)
    model = build(s["model"], s["attn"], s["layers"])
    prefill(model, 256)()  # warm up: libraries, thread pools, compile
    print(json.dumps(peak_of(prefill(model, s["n"]))))


def memory(model: str, attn: str, n: int, layers: int) -> float:
    """Peak extra MiB of one prefill, in a fresh subprocess."""
    spec = json.dumps({"model": model, "attn": attn, "n": n, "layers": layers})
    res = subprocess.run(
        [sys.executable, __file__, "--memory-child", spec], capture_output=True, text=True, check=True, timeout=1800
    )
    r = json.loads(res.stdout.strip().splitlines()[-1])
    return (r["peak"] - r["baseline"]) / 2**20


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--models", nargs="+", default=list(MODELS))
    p.add_argument("--backends", nargs="+", default=list(BACKENDS))
    p.add_argument("--prefill", nargs="+", type=int, default=[4096, 8192])
    p.add_argument("--eager-max", type=int, default=4096, help="skip eager above this length (N x N scores)")
    p.add_argument("--decode-prompt", type=int, default=2048)
    p.add_argument("--decode-tokens", type=int, default=32)
    p.add_argument("--train", nargs="*", type=int, default=[], help="training-step lengths (forward + backward)")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (qkv follows it)")
    p.add_argument("--targets", action="store_true", help="only issue 22's end-to-end targets (see above)")
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
    print(f"# torch {torch.__version__}, threads {torch.get_num_threads()}, loadavg {open('/proc/loadavg').read()}")
    if a.targets:
        a.layers, a.backends, a.rounds = 4, ["qkv", "sdpa", "free"], max(a.rounds, 5)
        plan = {"llama": ([], [2048], True), "mistral": ([4096], [], False)}
        a.decode_prompt, a.decode_tokens = 1024, 32
    else:
        plan = {name: (a.prefill, a.train, True) for name in a.models}
    for name, (prefills, trains, with_decode) in plan.items():
        models = {attn: build(name, attn, a.layers) for attn in a.backends}
        if "flex_attention" in models:
            t0 = time.perf_counter()
            prefill(models["flex_attention"], 512)()
            print(f"{name}: flex_attention first call (compile) {time.perf_counter() - t0:.1f} s")
        work = [(f"prefill {n}", n, prefill) for n in prefills] + [(f"train {n}", n, train_step) for n in trains]
        work += [("decode", None, None)] if with_decode else []
        for label, n, make in work:
            runs = {}
            for attn, m in models.items():
                if n is not None and attn == "eager" and n > a.eager_max:
                    continue
                f = make(m, n) if make is not None else decode(m, a.decode_prompt, a.decode_tokens)
                t0 = time.perf_counter()
                try:
                    f()  # warm-up (and flex's recompile for this shape)
                except Exception as e:  # e.g. inductor failing to compile flex decoding on this CPU
                    print(f"{name} {label} {attn}: failed ({type(e).__name__}: {str(e).splitlines()[0][:120]})")
                    continue
                runs[attn] = f
                if attn == "flex_attention":
                    print(f"{name} {label}: flex_attention warm-up {time.perf_counter() - t0:.1f} s")
            times = {attn: [] for attn in runs}
            for _ in range(a.rounds):
                for attn, f in runs.items():
                    if n is None:
                        times[attn].append(f())
                    else:
                        t0 = time.perf_counter()
                        f()
                        times[attn].append(time.perf_counter() - t0)
            base = statistics.median(times["qkv"]) if "qkv" in times else None
            for attn, ts in times.items():
                med = statistics.median(ts)
                unit = "ms/token" if n is None else "s"
                scale = 1e3 if n is None else 1.0
                ratio = f"{med / base:.2f}x qkv's time" if base else ""
                line = f"{name} {label} {attn}: median {med * scale:.3f} {unit} "
                line += f"(min {min(ts) * scale:.3f}, max {max(ts) * scale:.3f}) {ratio}"
                print(line, flush=True)
            if "free" in times and "sdpa" in times:
                bound = statistics.median(times["sdpa"]) / statistics.median(times["free"])
                gain = statistics.median(times["sdpa"]) / base if base else float("nan")
                print(f"{name} {label}: qkv gains {gain:.2f}x over sdpa; free attention would gain {bound:.2f}x")
            if a.memory and make is prefill:
                for attn in runs:
                    print(f"{name} {label} {attn}: peak extra {memory(name, attn, n, a.layers):.0f} MiB", flush=True)
    print(f"# loadavg after {open('/proc/loadavg').read()}")


if __name__ == "__main__":
    main()
