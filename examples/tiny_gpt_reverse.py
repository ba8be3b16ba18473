"""Teach a TinyGPT to reverse a sequence, look at its attention, and decode with a KV cache.

.venv/bin/python examples/tiny_gpt_reverse.py        (about ten seconds on a laptop CPU)
"""

import torch

from qkv.nn import KVCache
from qkv.train import make_batch, train

history = train("reverse", record_every=100, progress=True, seed=0)
print(f"held-out accuracy {history.eval_accuracy:.4f}, whole answers right {history.eval_exact:.4f}")

model = history.model
tokens, answer = make_batch("reverse", 1, generator=torch.Generator().manual_seed(42))
prompt = tokens[:, : answer[0]]  # x SEP
out = model.generate(prompt, len(answer))
print("prompt   ", prompt[0, :-1].tolist())
print("generated", out[0, answer[0] :].tolist())

# The same decode by hand: one prefill pass, then one position per step over the cache.
cache = KVCache()
logits = model(prompt, cache=cache)
for _ in range(len(answer)):
    nxt = logits[:, -1].argmax(-1, keepdim=True)
    prompt = torch.cat([prompt, nxt], dim=1)
    logits = model(nxt, cache=cache)
assert torch.equal(prompt, out)

# The last recorded attention maps: layer 1, head 0, rows = answer positions (the anti-diagonal).
final = history.attention[-1].weights[1][0]
print((final[answer[0] - 1 :, : answer[0] - 1] > 0.5).astype(int))
