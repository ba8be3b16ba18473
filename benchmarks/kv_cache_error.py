"""What an int8 or float8 KV cache changes: per-head attention error, logit drift, greedy tokens.

Two trained models, built in code (nothing downloads):

- a ``TinyGPT`` taught to reverse its prompt (``qkv.train("reverse")``), decoding with
  ``KVCache()`` (float32) against ``KVCache(dtype=...)``;
- a small transformers Llama (GQA 4/2, head_dim 16) taught to copy its prompt, in bfloat16,
  decoding with its own bfloat16 ``DynamicCache`` against ``QuantizedCache(dtype=...)``.

For each cache format: the per-head error of every attention call of the prompt's forward pass
(``qkv.diagnostics.cache_error`` on the queries, keys and values the layers computed: max over
layers of each head's max |Δout|, and the mean of each head's relative rms error), the greedy
tokens' agreement with the float cache over a free-running generate, and along the float
cache's own tokens (teacher forcing) the largest change of any log-probability, of the chosen
token's log-probability, and the mean KL divergence per step. These are errors, not timings:
the numbers do not depend on the machine's load.

    OMP_NUM_THREADS=2 HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/kv_cache_error.py [--llama-steps 150]
"""

import argparse
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from _report import setup  # noqa: E402

FORMATS = ("int8", "float8_e4m3fn", "float8_e5m2")


def _capture(module: Any, name: str) -> tuple[list[tuple[Any, Any, Any, dict[str, Any]]], Any]:
    """Record every ``qkv.attention`` call ``module.<name>`` makes: (q, k, v, keywords)."""
    calls: list[tuple[Any, Any, Any, dict[str, Any]]] = []
    original = getattr(module, name)

    def recorded(q: Any, k: Any, v: Any, **kw: Any) -> Any:
        calls.append((q.detach(), k.detach(), v.detach(), kw))
        return original(q, k, v, **kw)

    setattr(module, name, recorded)
    return calls, original


def head_errors(calls: list[Any], fmt: str) -> tuple[Any, Any]:
    """``(max |Δout| per query head, mean relative rms error per head)`` over the recorded calls."""
    import numpy as np

    import qkv

    worst, rel = None, []
    for q, k, v, kw in calls:
        kw = {n: x for n, x in kw.items() if n in ("mask", "causal", "scale", "score_mod", "bias")}
        e = qkv.diagnostics.cache_error(q.float(), k.float(), v.float(), fmt, **kw)
        worst = e.max_error if worst is None else np.maximum(worst, e.max_error)
        rel.append(e.relative)
    return worst, np.mean(rel, axis=0)


def drift(logits_float: Any, logits_q: Any, chosen: Any) -> dict[str, float]:
    """Along one token path: max |Δ log p| over the vocabulary, max |Δ log p| of the chosen tokens,
    mean KL(p_float ‖ p_q) per step."""

    a, b = logits_float.float().log_softmax(-1), logits_q.float().log_softmax(-1)
    picked = (a - b).gather(-1, chosen[..., None]).abs().max()
    kl = (a.exp() * (a - b)).sum(-1).mean()
    return {"max_dlogp": float((a - b).abs().max()), "max_dlogp_chosen": float(picked), "mean_kl": float(kl)}


def tinygpt_rows(steps: int | None) -> list[dict[str, Any]]:
    import torch

    import qkv.nn.attention as attention_module
    from qkv.nn import KVCache
    from qkv.train import make_batch, train

    model = train("reverse", steps, seed=0).model
    tokens, answer = make_batch("reverse", 32, generator=torch.Generator().manual_seed(42))
    prompt, n = tokens[:, : answer[0]], len(answer)
    calls, original = _capture(attention_module, "attention")
    with torch.no_grad():
        model(prompt)
    attention_module.attention = original
    want = model.generate(prompt, n)
    rows = []
    for fmt in FORMATS:
        got = model.generate(prompt, n, cache_dtype=fmt)
        with torch.no_grad():  # teacher forcing on the float cache's tokens
            lf, lq = [], []
            for cache, out in ((KVCache(), lf), (KVCache(dtype=fmt), lq)):
                logits = model(prompt, cache=cache)
                for i in range(n):
                    out.append(logits[:, -1])
                    logits = model(want[:, prompt.shape[1] + i : prompt.shape[1] + i + 1], cache=cache)
        worst, rel = head_errors(calls, fmt)
        rows.append(
            {
                "model": "TinyGPT reverse (float32 cache)",
                "format": fmt,
                "agree": float((got == want)[:, prompt.shape[1] :].float().mean()),
                **drift(torch.stack(lf, 1), torch.stack(lq, 1), want[:, prompt.shape[1] :]),
                "head_max": worst.tolist(),
                "head_rel": rel.tolist(),
            }
        )
    return rows


def llama_rows(steps: int) -> list[dict[str, Any]]:
    import torch
    import transformers
    from transformers.cache_utils import DynamicCache

    import qkv
    from qkv.integrations import transformers as qt

    qt.register()
    vocab, n, sep = 40, 8, 2
    cfg = transformers.LlamaConfig(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)

    def batch(b: int, gen: Any) -> Any:
        x = torch.randint(3, vocab, (b, n), generator=gen)
        return torch.cat([x, torch.full((b, 1), sep), x], 1)

    for _ in range(steps):
        x = batch(32, g)
        logits = model(x).logits[:, n:-1]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), x[:, n + 1 :].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    model = model.eval().to(torch.bfloat16)
    model.set_attn_implementation("qkv")
    prompt = batch(32, torch.Generator().manual_seed(7))[:, : n + 1]
    calls, original = _capture(qkv, "attention")
    with torch.no_grad():
        model(prompt)
    qkv.attention = original

    def generate(cache: Any) -> tuple[Any, Any]:
        with torch.no_grad():
            out = model.generate(
                prompt,
                cache=cache,
                max_new_tokens=n,
                do_sample=False,
                pad_token_id=0,
                output_scores=True,
                return_dict_in_generate=True,
            )
        return out.sequences, torch.stack(out.scores, 1)

    want, want_scores = generate(DynamicCache(config=model.config))
    rows = []
    for fmt in FORMATS:
        got, scores = generate(qt.QuantizedCache(model.config, dtype=fmt))
        worst, rel = head_errors(calls, fmt)
        agree = (got == want)[:, n + 1 :].float().mean()
        rows.append(
            {
                "model": f"Llama copy, bfloat16 (loss {loss.item():.3g})",
                "format": fmt,
                "agree": float(agree),
                **drift(want_scores, scores, want[:, n + 1 :]),  # the same path while the tokens agree
                "head_max": worst.tolist(),
                "head_rel": rel.tolist(),
            }
        )
    return rows


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--llama-steps", type=int, default=150)
    p.add_argument("--tinygpt-steps", type=int, default=None, help="default: the reverse task's budget")
    a = p.parse_args()
    info = setup()
    print(f"<!-- {info['date']}: {info['command']} (torch {info['torch']}) -->")
    rows = tinygpt_rows(a.tinygpt_steps) + llama_rows(a.llama_steps)
    print("| model | cache | greedy tokens agreeing | max Δlog p | max Δlog p (chosen) | mean KL / step |")
    print("|---|---|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['model']} | {r['format']} | {r['agree']:.1%} | {r['max_dlogp']:.3g} | "
            f"{r['max_dlogp_chosen']:.3g} | {r['mean_kl']:.2g} |"
        )
    print()
    print(
        "| model | cache | per head: max \\|Δout\\| over the prompt's attention calls | per head: relative rms error |"
    )
    print("|---|---|---|---|")
    for r in rows:
        mx = " ".join(f"{x:.2g}" for x in r["head_max"])
        rel = " ".join(f"{x:.2g}" for x in r["head_rel"])
        print(f"| {r['model']} | {r['format']} | {mx} | {rel} |")


if __name__ == "__main__":
    main()
