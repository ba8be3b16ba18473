"""The ``qkv`` command line: this module registers the subcommands and does nothing else.

One module per subcommand (``explain``, ``heatmap``, ``pe``, ``complexity``, ``train``,
``bench``, ``cache-error``, ``lab``, ``inspect``, ``info``); ``_common`` holds what they share:
reading arrays, the picture options, and the one path from an error to one stderr line and an exit code
(1 bad input, 2 bad usage). Each command parses, calls the public API and prints text (rich) or
``--json``; no math here.
Heavy libraries (torch, matplotlib, fastapi) are imported inside the commands that need them.
"""

import typer

from ._common import OneLineErrors
from .bench import bench_command
from .cache_error import cache_error_command
from .complexity import complexity_command
from .explain import explain_command
from .heatmap import heatmap_command
from .info import info_command
from .inspect import inspect_command
from .lab import lab_command
from .pe import pe_command
from .train import train_command

app = typer.Typer(
    name="qkv",
    cls=OneLineErrors,
    help="qkv: the attention mechanism, exact and easy to see into.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)


@app.callback()
def _root() -> None:
    """qkv: the attention mechanism, softmax(Q Kᵀ · scale) V, exact and easy to see into."""


for _name, _command in (
    ("explain", explain_command),
    ("heatmap", heatmap_command),
    ("pe", pe_command),
    ("complexity", complexity_command),
    ("train", train_command),
    ("inspect", inspect_command),
    ("bench", bench_command),
    ("cache-error", cache_error_command),
    ("lab", lab_command),
    ("info", info_command),
):
    app.command(_name)(_command)


def main() -> None:
    """Entry point of the ``qkv`` script and ``python -m qkv``."""
    app(prog_name="qkv")
