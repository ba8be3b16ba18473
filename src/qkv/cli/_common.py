"""What every subcommand shares: reading arrays, output options, and the one error path.

Errors: every subcommand runs inside ``OneLineErrors`` (the app's click group), so whatever
goes wrong ends as exactly one line on stderr, ``error: ...``, and one exit code, the same for
every command:

- **2, bad usage**: what click rejects while parsing (an unknown option, a value of the wrong
  type or outside the option's range, a missing value) and ``typer.BadParameter``;
- **1, bad input**: what qkv rejects (every ``QKVError``: shapes, masks, files, sizes), and
  operating-system errors reading or writing files.

Anything else is a bug in qkv and keeps its traceback.
"""

import math
import os
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperGroup

from .. import _io
from ..errors import ArgumentError, QKVError
from ..masks.spec import MASK_KINDS

FILE = ".npy, .npz[:key], .json[:key] or .csv"
"""The array files every command reads (``qkv._io``)."""

BAD_INPUT, BAD_USAGE = 1, 2


def one_line(message: str) -> str:
    """``message`` folded onto one line (no newlines reach the terminal)."""
    return " ".join(str(message).split())


def describe(e: BaseException) -> str:
    """One line for an error qkv reports: ``ShapeError: ...``, or the file and the OS's reason."""
    if isinstance(e, QKVError):
        return f"{type(e).__name__}: {one_line(str(e))}"
    if isinstance(e, OSError):
        return f"{getattr(e, 'filename', None) or ''}: {e.strerror or e}".lstrip(": ")
    return one_line(str(e))


def _is(e: BaseException, name: str) -> bool:
    """``e`` is click's exception ``name`` (typer may vendor its own click: compared by class name)."""
    return any(c.__name__ == name for c in type(e).__mro__)


class OneLineErrors(TyperGroup):
    """The ``qkv`` group: usage errors and qkv's own errors become one stderr line and an exit code."""

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        try:
            rv = super().main(args, prog_name, complete_var, False, windows_expand_args, **extra)
            code = rv if isinstance(rv, int) else 0  # not standalone: click returns an Exit's code
        except (QKVError, OSError) as e:
            typer.echo(f"error: {describe(e)}", err=True)
            code = BAD_INPUT
        except Exception as e:
            if _is(e, "Exit"):
                code = int(getattr(e, "exit_code", 0))
            elif _is(e, "UsageError"):
                ctx = getattr(e, "ctx", None)
                hint = f" (see {ctx.command_path} --help)" if ctx is not None else ""
                typer.echo(f"error: {one_line(e.format_message())}{hint}", err=True)  # type: ignore[attr-defined]
                code = BAD_USAGE
            elif _is(e, "Abort"):
                typer.echo("error: aborted", err=True)
                code = BAD_INPUT
            else:
                raise
        if not standalone_mode:
            return code
        sys.exit(code)


def read_inputs(q: str | None, k: str | None, v: str | None, inputs: str | None) -> tuple[Any, Any, Any]:
    """``(q, k, v)`` arrays from ``--q/--k/--v`` or ``--inputs``, or ``(None, None, None)`` for none."""
    given = {"--q": q, "--k": k, "--v": v}
    if inputs is not None:
        if any(x is not None for x in given.values()):
            raise ArgumentError("give either --inputs FILE or --q/--k/--v files, not both")
        return _io.read_qkv(inputs)
    if all(x is None for x in given.values()):
        return None, None, None
    missing = [name for name, x in given.items() if x is None]
    if missing:
        raise ArgumentError(
            f"--q, --k and --v go together (missing: {', '.join(missing)}); give none of them for the built-in example"
        )
    return _io.read_array(q), _io.read_array(k), _io.read_array(v)  # type: ignore[arg-type]


# the options of the commands that read q, k, v
QFile = Annotated[str | None, typer.Option("--q", metavar="FILE", help=f"queries (..., Nq, Dk): {FILE}")]
KFile = Annotated[str | None, typer.Option("--k", metavar="FILE", help=f"keys (..., Nk, Dk): {FILE}")]
VFile = Annotated[str | None, typer.Option("--v", metavar="FILE", help=f"values (..., Nk, Dv): {FILE}")]
Inputs = Annotated[
    str | None,
    typer.Option("--inputs", metavar="FILE", help="q, k and v from one .npz or .json file with keys q, k, v"),
]
MaskSpec = Annotated[
    str | None,
    typer.Option(
        "--mask",
        metavar="SPEC",
        help=f"kind[:key=value,...], e.g. sliding_window:window=4,causal=false; kinds: {', '.join(MASK_KINDS)}",
    ),
]

# the output options of the commands that draw pictures
Format = Annotated[str | None, typer.Option("--format", help="png, svg or html (default: from --out)")]
Size = Annotated[str | None, typer.Option("--size", metavar="WxH", help="picture size in inches")]
Dpi = Annotated[float, typer.Option("--dpi", min=1.0, max=1200.0, help="pixels per inch")]
JsonOut = Annotated[bool, typer.Option("--json", help="print what was written and the numbers, as JSON")]


def mask_of(spec: str | None, causal: bool, nq: int, nk: int) -> Any:
    """The ``Mask`` of ``--mask SPEC`` (the grammar of ``qkv.masks.spec``) and ``--causal``, or None."""
    from .. import masks
    from ..masks.spec import build_mask, parse_mask_spec

    m = None
    if spec is not None:
        kind, params = parse_mask_spec(spec)
        m = build_mask(kind, nq, nk, **params)
    if causal:
        m = masks.causal() if m is None else m & masks.causal()
    return m


def picture_size(text: str | None) -> tuple[float | None, float | None]:
    """``"8x4.5"`` -> inches; None keeps the picture's own size."""
    if text is None:
        return None, None
    w, sep, h = text.lower().partition("x")
    try:
        width, height = float(w), float(h)
    except ValueError:
        width = height = math.nan
    if not sep or not (math.isfinite(width) and math.isfinite(height) and 0 < width <= 100 and 0 < height <= 100):
        raise ArgumentError(f"--size must be WIDTHxHEIGHT in inches (each at most 100), e.g. 8x4.5, got {text!r}")
    return width, height


def output_path(out: Path | None, fmt: str | None, stem: str) -> tuple[Path, str]:
    """Where a picture goes and in which format (``--out`` / ``--format``, default ``STEM.png``)."""
    from ..plot import format_of

    path = out if out is not None else Path(f"{stem}.{(fmt or 'png').lower()}")
    return path, format_of(path, fmt)


def written(fig: Any, path: Path, fmt: str) -> dict[str, Any]:
    """What ``--json`` reports of one written picture: path, format and its size in pixels and inches."""
    from ..plot import pixel_size

    w, h = fig.get_size_inches()
    w_px, h_px = pixel_size(float(w), float(h), float(fig.dpi))
    return {
        "path": str(path),
        "format": fmt,
        "width_px": w_px,
        "height_px": h_px,
        "dpi": float(fig.dpi),
        "width_in": round(float(w), 3),
        "height_in": round(float(h), 3),
    }


@contextmanager
def all_or_nothing(paths: Sequence[Path]) -> Iterator[list[Path]]:
    """Write ``paths`` atomically as a group: the block writes to the temporary paths it is
    given (same directory, same suffix); only when it finishes are they renamed into place, so a
    failure leaves no partial output files behind. Directories must exist (a missing one is an
    ``OSError`` naming it)."""
    temps: list[Path] = []
    try:
        for p in paths:
            fd, name = tempfile.mkstemp(prefix=f".{p.stem}.", suffix=p.suffix, dir=p.parent)
            os.close(fd)
            temps.append(Path(name))
        yield temps
        for t, p in zip(temps, paths, strict=True):
            os.replace(t, p)
        temps = []
    finally:
        for t in temps:
            t.unlink(missing_ok=True)
