"""``qkv lab``: serve the local web lab with uvicorn.

FastAPI and uvicorn are imported inside the command, so ``qkv lab --help`` (and ``import
qkv.cli``) work without the ``lab`` extra; without it the command says how to install it.

Errors are one ``error:`` line, with the CLI's exit codes: 2 (bad usage) for a ``--host`` that
is not loopback without ``--allow-remote``, 1 (bad input) for a malformed or unresolvable
``--host``, a port that cannot be bound, or the missing extra.
"""

import json
import socket
from typing import Annotated, NoReturn

import typer

from ._common import BAD_INPUT

MISSING = "error: the lab needs the 'lab' extra: pip install 'qkv[lab]'"


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def _fail(message: str, code: int) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise SystemExit(code)


def lab_command(
    host: Annotated[
        str,
        typer.Option(
            "--host", help="interface to bind; the default serves this machine only (others need --allow-remote)"
        ),
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="port; 0 picks a free one")] = 8765,
    open_browser: Annotated[bool, typer.Option("--open", help="open the lab in a web browser")] = False,
    max_n: Annotated[
        int,
        typer.Option(
            "--max-n", min=2, max=1024, help="largest sequence length on the Explain, Heatmap and Positional pages"
        ),
    ] = 128,
    max_steps: Annotated[
        int | None,
        typer.Option(
            "--max-steps",
            min=1,
            max=10**9,
            help="most training steps one run of the Training page may ask for (default: the lab's limit, "
            "shown in /api/limits)",
        ),
    ] = None,
    allow_remote: Annotated[
        bool,
        typer.Option(
            "--allow-remote",
            help="allow a --host other machines can reach: the lab has no authentication, anyone who reaches it "
            "can use it",
        ),
    ] = False,
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            metavar="PATH",
            help="the transformers model folder of the Model page, loaded in the background as the lab starts "
            "(default: all-MiniLM-L6-v2 from qkv[model])",
        ),
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help='print {"url": ...} as JSON once serving')] = False,
) -> None:
    """Start the qkv lab, a local web app: Explain, Heatmap, Positional encodings, Complexity, Training, Model.

    Binds 127.0.0.1:8765 by default and opens nothing unless --open is given. Stop with Ctrl-C.
    A --host that is not a loopback address needs --allow-remote.
    """
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        _fail(MISSING.removeprefix("error: "), BAD_INPUT)
    from ..lab.app import create_app
    from ..lab.server import RemoteBind, check_host, hosts_for, make_server

    try:
        host, loopback = check_host(host, allow_remote)
    except RemoteBind as e:
        raise typer.BadParameter(str(e), param_hint="--host") from None  # bad usage: exit 2
    if port == 0:
        port = _free_port(host)
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{port}/"
    hosts, any_address = hosts_for(host)
    server = make_server(
        create_app(
            max_n=max_n, max_steps=max_steps, hosts=hosts, any_address=any_address, model=model, preload_model=True
        ),
        host,
        port,
    )

    def announce() -> None:
        if not loopback:
            typer.echo(
                f"WARNING: qkv lab is listening on {host}, reachable from other machines; its API has no "
                "authentication: anyone who can reach this port can use it (and run trainings on this machine)",
                err=True,
            )
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
        _fail(f"cannot serve at {url}: {e.strerror or e}", BAD_INPUT)
    except SystemExit:  # uvicorn exits when it cannot bind (it has logged why)
        server.started = False
    if not server.started:
        _fail(f"cannot serve at {url} (is the port in use? --port 0 picks a free one)", BAD_INPUT)
