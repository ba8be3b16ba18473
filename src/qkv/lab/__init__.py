"""``qkv lab``: the local web lab (FastAPI). Being built."""
