"""qkv's compiled attention kernel (see qkv._native for the Python API)"""

import enum
from typing import Annotated

from numpy.typing import NDArray


EMPTY: int = 0

PARTIAL: int = 1

FULL: int = 2

MAX_THREADS: int = 256

DECODE_MAX_NQ: int = 16

LANES: int = 16

BLOCK_Q: int = 64

BLOCK_K: int = 128

class ModKind(enum.IntEnum):
    MUL = 0

    SOFTCAP = 1

    ALIBI = 2

    RELBIAS = 3

DTYPES: tuple = ('float32', 'float64', 'float16', 'bfloat16')

class MaskKind(enum.IntEnum):
    NONE = 0

    ROWS = 1

    TILES = 2

class KvFormat(enum.IntEnum):
    NATIVE = 0

    I8 = 1

    E4M3 = 2

    E5M2 = 3

def isa() -> str: ...

def isas() -> list[str]: ...

def set_isa(name: str) -> None: ...

def decode_prefetch() -> str: ...

def set_decode_prefetch(name: str) -> None: ...

def tile_shape(nq: int, nk: int, dk: int, dv: int, dtype: str) -> tuple[int, int]: ...

def forward(q: Annotated[NDArray, dict(device='cpu', writable=False)], k: Annotated[NDArray, dict(device='cpu', writable=False)], v: Annotated[NDArray, dict(device='cpu', writable=False)], out: Annotated[NDArray, dict(device='cpu')], lse: Annotated[NDArray, dict(device='cpu')], **kw) -> tuple[int, int]: ...

def backward(q: Annotated[NDArray, dict(device='cpu', writable=False)], k: Annotated[NDArray, dict(device='cpu', writable=False)], v: Annotated[NDArray, dict(device='cpu', writable=False)], out: Annotated[NDArray, dict(device='cpu', writable=False)], lse: Annotated[NDArray, dict(device='cpu', writable=False)], dout: Annotated[NDArray, dict(device='cpu', writable=False)], dq: Annotated[NDArray, dict(device='cpu')], dk: Annotated[NDArray, dict(device='cpu')], dv: Annotated[NDArray, dict(device='cpu')], **kw) -> tuple[int, int]: ...

def philox_keep_into(keep: Annotated[NDArray, dict(device='cpu')], seed: int, b: int, h: int, i0: int, j0: int, p: float) -> None: ...

def _microbench(arg0: int, arg1: int, /) -> float: ...

def philox4x32(arg0: int, arg1: int, arg2: int, arg3: int, arg4: int, arg5: int, /) -> tuple: ...

def ffi_handlers() -> tuple: ...
