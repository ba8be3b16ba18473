"""Bridges from other libraries to qkv; each submodule imports its library only when used.

- ``qkv.integrations.transformers``: ``register(name="qkv", impl="auto")`` makes qkv an
  attention implementation of Hugging Face transformers (``attn_implementation="qkv"``).

Importing this package imports nothing heavy (no torch, no transformers).
"""
