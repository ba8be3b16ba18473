"""``qkv heatmap`` and ``qkv pe`` (registered by ``qkv.cli``). Placeholder: being built."""

import typer


def heatmap_command() -> None:
    """Attention weights as a heatmap (being built)."""
    raise typer.Exit(1)


def pe_command() -> None:
    """Positional encodings as pictures (being built)."""
    raise typer.Exit(1)
