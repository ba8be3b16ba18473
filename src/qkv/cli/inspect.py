"""``qkv inspect TEXT``: look inside a real transformers model on your own sentence.

Parse -> ``qkv.inspect`` (one forward pass, weights captured) -> ``Inspection.approximations``
-> a rich table of the head summary and four pictures in ``--out`` (``qkv.plot``): the grid of
every layer x head, one head at full size with its tokens, the rollout and the approximation
errors; ``--json`` prints the numbers instead of the table. A progress bar (on stderr) while
the model loads and runs. Without the ``qkv[model]`` extra the command says what to install
(exit 1); a missing folder, a folder without a transformers model, a model that needs its own
Python code (never run: no prompt, stdin is never read), weights only as a pickle (never
unpickled), a folder without a tokenizer, a corrupt config or weights file, weights whose
shapes disagree with the config, a tokenizer whose ids the weights do not have, a TEXT that is
not valid UTF-8, a text longer than the model takes and an architecture that bypasses
transformers' attention interface are one ``error:`` line each (exit 1), on stderr: stdout
stays empty. torch, transformers and matplotlib are imported when it runs.
"""

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

from ._common import Dpi, JsonOut, Size, all_or_nothing, picture_size, written

PICTURES = ("grid", "head", "rollout", "approximations")
"""The pictures written to ``--out``, as ``NAME.png`` (the head as ``head_L{layer}_H{head}.png``)."""


@contextmanager
def _progress(enabled: bool) -> Iterator[Callable[[str], None]]:
    """A step-by-step progress bar on stderr (nothing with ``enabled=False``); yields ``step(description)``."""
    if not enabled:
        yield lambda description: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    steps = 4
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as bar:
        task = bar.add_task("", total=steps)
        first = [True]

        def step(description: str) -> None:
            if not first[0]:
                bar.advance(task)
            first[0] = False
            bar.update(task, description=description)

        yield step
        bar.update(task, completed=steps)


def _chosen_head(insp: Any, layer: int | None, head: int | None) -> tuple[int, int]:
    """The head drawn at full size: ``--layer``/``--head`` if given, else the kept head whose
    pattern scores highest (the clearest one)."""
    candidates = [s for s in insp.heads if (layer is None or s.layer == layer) and (head is None or s.head == head)]
    best = max(candidates, key=lambda s: (s.pattern not in ("broad", "mixed"), s.score))
    return best.layer, best.head


def _table(insp: Any, approx: Any) -> None:
    from rich.console import Console
    from rich.table import Table

    window = approx.methods.index("window")
    table = Table(
        title=f"{insp.model} ({insp.architecture}): {len(insp.tokens)} tokens, "
        f"{len(insp.layer_ids)} of {insp.n_layers} layers x {len(insp.head_ids)} of {insp.n_heads} heads",
        title_justify="left",
    )
    for name, justify in (
        ("layer", "right"),
        ("head", "right"),
        ("pattern", "left"),
        ("score", "right"),
        ("entropy", "right"),
        (f"mass outside window {approx.params['window']}", "right"),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for s in insp.heads:
        li, hi = insp.index(s.layer, s.head)
        table.add_row(
            str(s.layer),
            str(s.head),
            s.label,
            f"{s.score:.2f}",
            f"{s.entropy:.2f}",
            f"{float(approx.mass_outside[window, li, hi]):.2f}",
        )
    console = Console(highlight=False, soft_wrap=True)
    console.print(table)
    console.print("tokens: " + " ".join(insp.tokens))
    for line in approx.summary():
        console.print(f"• {line}")


def inspect_command(
    text: Annotated[str, typer.Argument(help="the sentence to look at (in quotes)")],
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            metavar="PATH",
            help="a transformers model folder or hub name (default: all-MiniLM-L6-v2 from the qkv[model] extra)",
        ),
    ] = None,
    layer: Annotated[int | None, typer.Option("--layer", min=0, help="only this layer (default: all)")] = None,
    head: Annotated[int | None, typer.Option("--head", min=0, help="only this head (default: all)")] = None,
    out: Annotated[
        Path, typer.Option("--out", metavar="DIR", help="where the pictures go (created if missing)")
    ] = Path("qkv-inspect"),
    window: Annotated[
        int, typer.Option("--window", min=1, max=512, help="the sliding window of the approximations table")
    ] = 8,
    size: Size = None,
    dpi: Dpi = 100.0,
    json_out: JsonOut = False,
) -> None:
    """Run a trained transformer on TEXT and show what every layer and head attends to.

    Prints each head's computed pattern (previous token, [CLS] sink, broad, ...) and what a
    sliding window, Longformer, BigBird, Performer or Linformer would lose on this input;
    writes grid.png, head_L{l}_H{h}.png, rollout.png and approximations.png to --out.
    """
    from .. import plot
    from .._inspect import check_text, inspect, load_model

    width, height = picture_size(size)
    check_text(text)  # invalid UTF-8 in TEXT is refused before the model loads
    with _progress(not json_out) as step:
        step("loading the model")
        loaded = load_model(model)
        step("running the model")
        insp = inspect(text, loaded, layers=layer, heads=head)
        step("measuring the approximations")
        approx = insp.approximations(window)
        step("drawing")
        chosen = _chosen_head(insp, layer, head)
        li, hi = insp.index(*chosen)
        figures = {
            "grid": plot.head_grid(
                insp.weights,
                insp.tokens,
                layer_ids=insp.layer_ids,
                head_ids=insp.head_ids,
                titles=[s.label for s in insp.heads],
                width=width,
                height=height,
                dpi=dpi,
            ),
            "head": plot.heatmap(
                insp.weights[li, hi],
                tokens_q=insp.tokens,
                tokens_k=insp.tokens,
                mask=insp.allowed[li],
                annotate=False,
                suptitle=f"{insp.model}: layer {chosen[0]} head {chosen[1]}, {insp.summary(*chosen).label}",
                width=width,
                height=height,
                dpi=dpi,
            ),
            "rollout": plot.rollout_figure(insp.rollout, insp.tokens, width=width, height=height, dpi=dpi),
            "approximations": plot.approximation_figure(
                approx.error,
                approx.labels,
                layer_ids=approx.layer_ids,
                head_ids=approx.head_ids,
                width=width,
                height=height,
                dpi=dpi,
            ),
        }
        out.mkdir(parents=True, exist_ok=True)
        names = {name: f"head_L{chosen[0]}_H{chosen[1]}" if name == "head" else name for name in PICTURES}
        paths = [out / f"{names[name]}.png" for name in PICTURES]
        with all_or_nothing(paths) as temps:
            for name, temp in zip(PICTURES, temps, strict=True):
                plot.save(figures[name], temp, "png")
    if json_out:
        files = {name: written(figures[name], p, "png") for name, p in zip(PICTURES, paths, strict=True)}
        typer.echo(json.dumps(insp.to_dict() | {"approximations": approx.to_dict(), "files": files}))
        return
    _table(insp, approx)
    typer.echo(f"pictures in {out}: " + ", ".join(p.name for p in paths))
