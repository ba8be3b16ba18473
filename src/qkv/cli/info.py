"""``qkv info``: what qkv found on this machine (``qkv.info()``), as text or ``--json``."""

import json
from typing import Annotated

import typer

from .._info import info


def info_command(
    json_out: Annotated[bool, typer.Option("--json", help="print the facts as JSON")] = False,
    line: Annotated[bool, typer.Option("--line", help="print the one-line form (benchmark headers)")] = False,
) -> None:
    """Say what qkv found here: the CPU and the kernel's ISA path, whether the compiled engine, the
    torch operator and the JAX handler are there (and why not), threads, versions.

    Imports torch and JAX only when they are installed (to ask them).
    """
    found = info()
    typer.echo(json.dumps(found.to_dict(), indent=1) if json_out else found.line() if line else str(found))
