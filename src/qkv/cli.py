"""The ``qkv`` command line: ``qkv explain`` here; bench, complexity, heatmap, pe, train and lab beside it.

Parse -> call the public API -> print text (rich) or ``--json``; no math here. Every error
qkv raises on purpose (``QKVError``, unreadable files included) becomes one line on stderr,
``error: ...``, and exit code 1: no traceback for a caller's mistake.
"""

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console

import qkv

from . import _io
from .errors import QKVError

app = typer.Typer(
    name="qkv",
    help="qkv: the attention mechanism, exact and easy to see into.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)

FILE = ".npy, .npz[:key], .json[:key] or .csv"


@app.callback()
def _root() -> None:
    """qkv: the attention mechanism, softmax(Q Kᵀ · scale) V, exact and easy to see into."""


@contextmanager
def _one_line_errors() -> Iterator[None]:
    """Turn qkv's own errors (and OS errors writing output) into ``error: ...`` on stderr, exit 1."""
    try:
        yield
    except QKVError as e:
        _fail(f"{type(e).__name__}: {e}")
    except OSError as e:
        _fail(f"{getattr(e, 'filename', None) or ''}: {e.strerror or e}".lstrip(": "))


def _fail(message: str) -> NoReturn:
    typer.echo("error: " + " ".join(message.split()), err=True)
    raise typer.Exit(1)


def _read_inputs(q: str | None, k: str | None, v: str | None, inputs: str | None) -> tuple[Any, Any, Any]:
    """``(q, k, v)`` arrays from the options, or ``(None, None, None)`` for the built-in example."""
    given = {"--q": q, "--k": k, "--v": v}
    if inputs is not None:
        if any(x is not None for x in given.values()):
            _fail("give either --inputs FILE or --q/--k/--v files, not both")
        return _io.read_qkv(inputs)
    if all(x is None for x in given.values()):
        return None, None, None
    missing = [name for name, x in given.items() if x is None]
    if missing:
        _fail(
            f"--q, --k and --v go together (missing: {', '.join(missing)}); give none of them for the built-in example"
        )
    return _io.read_array(q), _io.read_array(k), _io.read_array(v)  # type: ignore[arg-type]


@app.command()
def explain(
    q: Annotated[str | None, typer.Option("--q", metavar="FILE", help=f"queries (..., Nq, Dk): {FILE}")] = None,
    k: Annotated[str | None, typer.Option("--k", metavar="FILE", help=f"keys (..., Nk, Dk): {FILE}")] = None,
    v: Annotated[str | None, typer.Option("--v", metavar="FILE", help=f"values (..., Nk, Dv): {FILE}")] = None,
    inputs: Annotated[
        str | None,
        typer.Option("--inputs", metavar="FILE", help="q, k and v from one .npz or .json file with keys q, k, v"),
    ] = None,
    causal: Annotated[bool, typer.Option("--causal", help="mask future keys (bottom-right aligned)")] = False,
    scale: Annotated[float | None, typer.Option("--scale", help="score scale; default 1/sqrt(Dk)")] = None,
    grad: Annotated[bool, typer.Option("--grad", help="add the backward steps for dO = ones")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="print the trace as JSON")] = False,
    html: Annotated[Path | None, typer.Option("--html", metavar="FILE", help="write the trace as HTML")] = None,
) -> None:
    """Replay attention step by step: S = QKᵀ, scaled, masked, A = softmax(S), row sums, entropy, O = AV.

    Without --q/--k/--v or --inputs it explains the built-in example (Q 2×2, K 3×2, V 3×2).
    """
    with _one_line_errors():
        trace = qkv.explain(*_read_inputs(q, k, v, inputs), causal=causal, scale=scale, grad=grad)
        if html is not None:
            html.write_text(trace.to_html(), encoding="utf-8")
        if json_out:
            typer.echo(json.dumps(trace.to_dict(), indent=2))  # ASCII: safe on any terminal
        else:
            Console(soft_wrap=True, highlight=False, markup=False, emoji=False).print(str(trace), end="")


def _register_later_commands() -> None:
    """Subcommands whose modules sit beside the core (imported here, not at ``import qkv``)."""
    from ._complexity_cli import complexity_command
    from ._plot_cli import heatmap_command, pe_command
    from ._train_cli import train_command
    from .bench.cli import bench_command
    from .lab.cli import lab_command

    app.command("bench")(bench_command)
    app.command("complexity")(complexity_command)
    app.command("heatmap")(heatmap_command)
    app.command("pe")(pe_command)
    app.command("train")(train_command)
    app.command("lab")(lab_command)


_register_later_commands()


def main() -> None:
    """Entry point of the ``qkv`` script and ``python -m qkv``."""
    app(prog_name="qkv")
