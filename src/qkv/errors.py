"""The exceptions qkv raises on purpose; every one derives from ``QKVError``.

Messages follow one pattern: which argument, which axis, the sizes seen, the shapes.
"""


class QKVError(Exception):
    """Base of every error qkv raises on purpose."""


class ShapeError(QKVError, ValueError):
    """Arrays whose shapes do not fit together (``Dk``, ``Nk``, heads, batch axes)."""


class MaskError(QKVError, ValueError):
    """A mask of the wrong kind, dtype or shape for the scores it should cover."""


class DTypeError(QKVError, TypeError):
    """Unsupported or mismatched dtypes, or arrays of mixed kinds (NumPy with torch)."""


class ArgumentError(QKVError, ValueError):
    """A bad scalar argument: an unknown ``impl``, a dropout outside [0, 1), a non-finite scale."""
