"""``qkv lab`` (registered by ``qkv.cli``). Placeholder: being built."""

import typer


def lab_command() -> None:
    """Start the local web lab (being built)."""
    raise typer.Exit(1)
