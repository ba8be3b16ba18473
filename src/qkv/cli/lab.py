"""``qkv lab``: serve the local web lab with uvicorn.

FastAPI and uvicorn are imported inside the command, so ``qkv lab --help`` (and ``import
qkv.cli``) work without the ``lab`` extra; without it the command says how to install it.
"""

import json
import socket
from typing import Annotated

import typer

MISSING = "error: the lab needs the 'lab' extra: pip install 'qkv[lab]'"


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def lab_command(
    host: Annotated[
        str, typer.Option("--host", help="interface to bind; the default serves this machine only")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="port; 0 picks a free one")] = 8765,
    open_browser: Annotated[bool, typer.Option("--open", help="open the lab in a web browser")] = False,
    max_n: Annotated[
        int,
        typer.Option(
            "--max-n", min=2, max=1024, help="largest sequence length on the Explain, Heatmap and Positional pages"
        ),
    ] = 128,
    json_out: Annotated[bool, typer.Option("--json", help='print {"url": ...} as JSON once serving')] = False,
) -> None:
    """Start the qkv lab, a local web app: Explain, Heatmap, Positional encodings, Complexity, Training.

    Binds 127.0.0.1:8765 by default and opens nothing unless --open is given. Stop with Ctrl-C.
    """
    try:
        import fastapi  # noqa: F401
        import uvicorn
    except ImportError:
        typer.echo(MISSING, err=True)
        raise typer.Exit(1) from None
    from ..lab.app import create_app

    if port == 0:
        port = _free_port(host)
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{port}/"
    config = uvicorn.Config(
        create_app(max_n=max_n), host=host, port=port, log_level="warning", timeout_graceful_shutdown=2
    )
    server = uvicorn.Server(config)

    def announce() -> None:
        typer.echo(json.dumps({"url": url}) if json_out else f"qkv lab serving at {url}  (Ctrl-C to stop)")
        if open_browser:
            import webbrowser

            webbrowser.open(url)

    original_startup = server.startup

    async def startup(sockets: list[socket.socket] | None = None) -> None:
        await original_startup(sockets)
        if server.started:
            announce()

    server.startup = startup  # type: ignore[method-assign]
    try:
        server.run()
    except OSError as e:
        typer.echo(f"error: cannot serve at {url}: {e.strerror or e}", err=True)
        raise typer.Exit(1) from None
    except SystemExit:  # uvicorn exits when it cannot bind (it has logged why)
        server.started = False
    if not server.started:
        typer.echo(f"error: cannot serve at {url} (is the port in use? --port 0 picks a free one)", err=True)
        raise typer.Exit(1)
