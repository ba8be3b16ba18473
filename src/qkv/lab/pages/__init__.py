"""The lab's pages: one shell (``shell.html``: the head, the stylesheet, the shared and the page's
script) around each page's own ``<main>`` (``NAME.html``), put together once when the app is built."""

from pathlib import Path
from string import Template

HERE = Path(__file__).parent
TITLES = {
    "explain": "Explain",
    "heatmap": "Heatmap",
    "positional": "Positional encodings",
    "complexity": "Complexity",
    "training": "Training",
    "model": "Model",
}


def render(name: str) -> str:
    """The page ``name`` (a key of ``TITLES``) as one HTML document."""
    shell = Template((HERE / "shell.html").read_text("utf-8"))
    return shell.substitute(name=name, title=TITLES[name], main=(HERE / f"{name}.html").read_text("utf-8"))
