"""The lab as a server left running on a machine: the Host check (DNS rebinding), the body limit,
refusals that never echo a long value, connections that dawdle (slowloris) and binds other
machines can reach. Server behaviour is checked through a real ``qkv lab`` on loopback with raw
sockets, so that nothing (a client library, a TestClient) tidies the requests up."""

import json
import re
import socket
import subprocess
import sys
import time

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from _lab_server import lab_process, lab_server  # noqa: E402
from qkv.lab.app import create_app  # noqa: E402
from qkv.lab.guard import HostGuard  # noqa: E402
from qkv.lab.schemas import Limits  # noqa: E402
from qkv.lab.server import hosts_for  # noqa: E402

LIMITS = Limits()


def port_of(url):
    return int(url.rstrip("/").rsplit(":", 1)[1])


def exchange(port, request, *, timeout=10.0, host="127.0.0.1"):
    """Send ``request`` (bytes) on a new connection and read until the server closes it or one whole
    response (by Content-Length) has arrived; ``(status, headers, body)``."""
    with socket.create_connection((host, port), timeout=timeout) as s:
        s.sendall(request)
        return read_response(s)


def read_response(s):
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    length = int(headers.get("content-length", -1))
    while length < 0 or len(body) < length:
        chunk = s.recv(65536)
        if not chunk:
            break
        body += chunk
    return status, headers, body


def http(method, path, host_header, body=b"", extra=""):
    host_line = "" if host_header is None else f"Host: {host_header}\r\n"
    head = f"{method} {path} HTTP/1.1\r\n{host_line}Connection: close\r\n{extra}"
    if method == "POST":
        head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    return head.encode("latin-1") + b"\r\n" + body


@pytest.fixture(scope="module")
def lab():
    with lab_server() as url:
        yield url


# --------------------------------------------------------------------------- 1. the Host header

ROUTES = [
    ("GET", "/", b""),
    ("GET", "/explain", b""),
    ("GET", "/training", b""),
    ("GET", "/static/style.css", b""),
    ("GET", "/api/limits", b""),
    ("GET", "/api/openapi.json", b""),
    ("GET", "/api/docs", b""),
    ("GET", "/api/train/history?client=x", b""),
    ("GET", "/api/train/events?client=x", b""),
    ("POST", "/api/heatmap", b'{"n_q": 4}'),
    ("POST", "/api/train/start?client=x", b'{"steps": 1}'),
    ("GET", "/no/such/page", b""),
]
FOREIGN = [
    "evil.example",
    "evil.example:{port}",
    "127.0.0.1.evil.example",
    "localhost.evil.example:{port}",
    "evil.example#@127.0.0.1",
    "127.0.0.1:{port}@evil.example",
    "127.0.0.1:abc",
    "[::1",
    "192.168.1.20:{port}",  # an address, but the lab was bound to 127.0.0.1 only
    "",
    None,  # no Host header at all
]
OWN = ["127.0.0.1", "127.0.0.1:{port}", "localhost", "localhost:{port}", "LocalHost:{port}", "[::1]:{port}", "[::1]"]


def test_a_foreign_host_header_is_refused_on_every_route(lab):
    port = port_of(lab)
    for method, path, body in ROUTES:
        for host in FOREIGN:
            header = None if host is None else host.format(port=port)
            status, headers, answer = exchange(port, http(method, path, header, body))
            assert status == 400, (method, path, header, status)
            if header is not None and header:
                assert headers["content-type"] == "application/json"
                message = json.loads(answer)["message"]
                assert "DNS rebinding" in message and "127.0.0.1, localhost, [::1]" in message


def test_the_names_of_this_machine_are_served(lab):
    port = port_of(lab)
    for host in OWN:
        status, _, answer = exchange(port, http("GET", "/api/limits", host.format(port=port)))
        assert status == 200 and json.loads(answer)["max_n"] == 128, host
        status, _, _ = exchange(port, http("GET", "/heatmap", host.format(port=port)))
        assert status == 200


def test_a_long_host_header_is_not_echoed(lab):
    status, _, answer = exchange(port_of(lab), http("GET", "/api/limits", "e" * 5000 + ".example"))
    assert status == 400 and len(answer) < 1500 and "e" * 200 not in answer.decode()


@pytest.mark.parametrize(
    ("bound", "header", "allowed"),
    [
        ("127.0.0.1", "127.0.0.1:8765", True),
        ("127.0.0.1", "localhost", True),
        ("127.0.0.1", "[::1]:8765", True),
        ("127.0.0.1", "evil.example", False),
        ("127.0.0.1", "10.0.0.5", False),
        ("::1", "[::1]:1", True),
        ("::1", "::1", False),  # an IPv6 host needs its brackets in a Host header
        ("lab.internal", "LAB.internal.:80", True),
        ("lab.internal", "lab.internal.evil.example", False),
        ("0.0.0.0", "10.0.0.5:8765", True),  # a wildcard bind is reached by the machine's addresses
        ("0.0.0.0", "[fe80::1]:8765", True),
        ("0.0.0.0", "evil.example:8765", False),
        ("::", "evil.example", False),
    ],
)
def test_host_guard_table(bound, header, allowed):
    hosts, any_address = hosts_for(bound)
    assert HostGuard(None, hosts, any_address).allows(header) is allowed


def test_create_app_with_hosts_refuses_other_names_through_testclient():
    app = create_app(hosts=("127.0.0.1",))
    with TestClient(app, base_url="http://127.0.0.1") as c:
        assert c.get("/api/limits").status_code == 200
    with TestClient(app) as c:  # Host: testserver
        assert c.get("/api/limits").status_code == 400 and c.get("/explain").status_code == 400


# --------------------------------------------------------------------------- 3. request bodies


def test_a_body_above_the_limit_is_refused_before_it_is_sent(lab):
    """Content-Length above the limit: 413 at once, while the client has sent no byte of the body."""
    port, limit = port_of(lab), LIMITS.max_body_bytes
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(
            f"POST /api/explain HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {limit + 1}\r\n\r\n".encode()
        )
        t0 = time.monotonic()
        status, _, body = read_response(s)
    assert status == 413 and time.monotonic() - t0 < 3
    message = json.loads(body)["message"]
    assert f"max_body_bytes={limit}" in message and str(limit + 1) in message


def test_a_streamed_body_above_the_limit_is_refused(lab):
    """Chunked transfer encoding (no Content-Length): 413 once the limit is passed."""
    port, limit = port_of(lab), LIMITS.max_body_bytes
    piece = b'{"q": [[' + b"1," * 30000
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(
            b"POST /api/explain HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        sent = 0
        try:
            while sent <= limit + len(piece):
                s.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
                sent += len(piece)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed while we were still sending
        status, _, body = read_response(s)
    assert status == 413 and "streamed" in json.loads(body)["message"]


def test_a_body_within_the_limit_is_parsed(lab):
    limit = LIMITS.max_body_bytes
    row = "[" + ",".join(["0.5"] * 200) + "]"
    body = ('{"q": [' + ",".join([row] * 100) + '], "k": [[1.0]], "v": [[1.0]], "pad": "' + "x" * 10 + '"}').encode()
    padded = body[:-2] + b"x" * (limit - len(body) - 10) + body[-2:]
    assert limit - 20 < len(padded) <= limit
    status, _, answer = exchange(port_of(lab), http("POST", "/api/explain", "127.0.0.1", padded), timeout=30)
    assert status == 422, answer[:300]  # parsed and refused for what it says, not for its size
    assert "pad" in json.loads(answer)["message"] and len(answer) < 3000


LONG = "x" * 300_000


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/api/explain", {"mask": LONG}),
        ("/api/heatmap", {"mask": LONG}),
        ("/api/complexity", {"mask": LONG}),
        ("/api/explain", {"q": LONG}),
        ("/api/explain", {"q": [[LONG]]}),
        ("/api/explain", {"q": [], "k": [[1]], "v": [[1]], LONG: 1}),
        ("/api/heatmap", {"mask": "sliding_window", "mask_params": {"window": LONG}}),
        ("/api/heatmap", {"mask": "document", "mask_params": {"doc_lengths": "1+" * 100_000 + "1"}}),
        ("/api/heatmap", {"mask": "sliding_window", "mask_params": {LONG: 1}}),
        ("/api/positional", {"kind": LONG}),
        ("/api/train/start?client=echo", {"task": LONG}),
        ("/api/explain", {"q": [["x"] * 50_000], "k": [[1]], "v": [[1]]}),  # fifty thousand problems
        ("/api/explain", {"q": [[1, 2]] * 2 + [list(range(50_000))], "k": [[1]], "v": [[1]]}),
    ],
)
def test_a_refusal_never_echoes_a_long_value(path, body):
    with TestClient(create_app()) as c:
        r = c.post(path, json=body)
    assert r.status_code == 422, r.text[:300]
    answer = r.json()
    assert answer["message"] and len(r.content) < 6000, len(r.content)
    assert not re.search(r"(x{101}|(1\+){60}|(\d+, ){200})", r.text), r.text[:500]
    if isinstance(answer["detail"], list):
        assert len(answer["detail"]) <= 20 and all(set(p) == {"loc", "msg", "type"} for p in answer["detail"])


def test_many_problems_are_counted_not_listed():
    with TestClient(create_app()) as c:
        r = c.post("/api/explain", json={"q": [["x"] * 1000], "k": [[1]], "v": [[1]]})
    assert r.status_code == 422 and "and 980 more problems" in r.json()["message"]


# --------------------------------------------------------------------------- 6. connections that dawdle

PARTIAL = [
    pytest.param(b"", id="silent"),
    pytest.param(b"GET /api/limits HTTP/1.1\r\nHost: 127.0.0.1\r\n", id="headers-unfinished"),
    pytest.param(
        b"POST /api/heatmap HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100\r\n\r\n{",
        id="body-unfinished",
    ),
]


def test_a_connection_that_never_finishes_its_request_is_closed(lab):
    """Slowloris: each connection sends part of a request (and one keeps trickling headers);
    the server closes every one within the request timeout and still answers others."""
    port, timeout = port_of(lab), LIMITS.request_timeout_seconds
    sockets = []
    for p in PARTIAL:
        s = socket.create_connection(("127.0.0.1", port), timeout=timeout + 10)
        s.sendall(p.values[0])
        sockets.append(s)
    trickle = socket.create_connection(("127.0.0.1", port), timeout=timeout + 10)
    trickle.sendall(b"GET /api/limits HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    t0 = time.monotonic()
    closed_trickle = None
    while time.monotonic() - t0 < timeout + 5:  # a header line every half second, never the end
        try:
            trickle.sendall(b"X-Slow: %d\r\n" % int(time.monotonic() * 10))
        except (BrokenPipeError, ConnectionResetError):
            closed_trickle = time.monotonic() - t0
            break
        time.sleep(0.5)
    trickle.close()
    assert closed_trickle is not None and closed_trickle < timeout + 3, closed_trickle
    for s in sockets:
        with s:
            try:
                leftover = s.recv(65536)  # b"" once closed; a timeout fails the test
            except ConnectionResetError:
                leftover = b""
            assert leftover == b"", leftover
    assert time.monotonic() - t0 < timeout + 8
    assert exchange(port, http("GET", "/api/limits", "127.0.0.1"))[0] == 200


CLOSE = b"Connection: close\r\n"


def head_of(size, extra=b""):
    """A whole request head (request line, headers, blank line) of exactly ``size`` bytes."""
    start = b"GET /api/limits HTTP/1.1\r\nHost: 127.0.0.1\r\n" + extra + b"X-Big: "
    end = b"\r\n\r\n"
    return start + b"a" * (size - len(start) - len(end)) + end


def send_head(port, head, pieces=1):
    """Send ``head`` in ``pieces`` writes (one ``sendall`` each) and read the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        step = -(-len(head) // pieces)
        try:
            for i in range(0, len(head), step):
                s.sendall(head[i : i + step])
                if pieces > 1:
                    time.sleep(0.05)  # let the server read each piece on its own
        except (BrokenPipeError, ConnectionResetError):
            pass
        return read_response(s)


@pytest.mark.parametrize("size", [20_000, 64_000, LIMITS.max_header_bytes + 1])
@pytest.mark.parametrize("pieces", [1, 4], ids=["one-write", "in-pieces"])
def test_headers_larger_than_the_limit_are_refused(lab, size, pieces):
    """A head above ``max_header_bytes`` is refused (431) however it arrives: h11's own limit saw
    only a head still incomplete, so one that came in a single write was served."""
    status, headers, body = send_head(port_of(lab), head_of(size), pieces)
    assert status == 431, (size, pieces, status)
    assert headers["content-type"] == "application/json" and headers["connection"] == "close"
    assert f"max_header_bytes={LIMITS.max_header_bytes}" in json.loads(body)["message"]


@pytest.mark.parametrize("pieces", [1, 4], ids=["one-write", "in-pieces"])
def test_headers_at_the_limit_are_served(lab, pieces):
    assert send_head(port_of(lab), head_of(LIMITS.max_header_bytes), pieces)[0] == 200
    assert send_head(port_of(lab), head_of(LIMITS.max_header_bytes - 100), pieces)[0] == 200


def test_a_large_head_after_a_small_request_on_one_connection_is_refused(lab):
    """Keep-alive: the second request's head is counted from its own start, whatever came before
    in the same read (the first request and its body)."""
    body = b'{"n_q": 4}'
    first = (
        b"POST /api/heatmap HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    for second, statuses in ((head_of(20_000), [200, 431]), (head_of(LIMITS.max_header_bytes, CLOSE), [200, 200])):
        with socket.create_connection(("127.0.0.1", port_of(lab)), timeout=10) as s:
            s.sendall(first + second)
            answers = b""
            while chunk := s.recv(65536):  # both answers, until the server closes the connection
                answers += chunk
        assert [int(x) for x in re.findall(rb"HTTP/1.1 (\d{3}) ", answers)] == statuses


def test_an_idle_keep_alive_connection_is_closed(lab):
    with socket.create_connection(("127.0.0.1", port_of(lab)), timeout=LIMITS.keep_alive_seconds + 10) as s:
        s.sendall(b"GET /api/limits HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        assert read_response(s)[0] == 200
        t0 = time.monotonic()
        assert s.recv(100) == b""
        assert time.monotonic() - t0 < LIMITS.keep_alive_seconds + 3


# --------------------------------------------------------------------------- 7. binds other machines can reach


def qkv_lab(*args):
    return subprocess.run(
        [sys.executable, "-m", "qkv", "lab", "--port", "0", *args], capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    ("args", "code", "words"),
    [
        (["--host", "0.0.0.0"], 2, ["--host", "0.0.0.0", "not a loopback", "--allow-remote"]),
        (["--host", "::"], 2, ["--host", "not a loopback", "--allow-remote"]),
        (["--host", "not a host"], 1, ["--host", "'not a host'", "IP address or a host name"]),
        (["--host", "1.2.3.4.5"], 1, ["--host", "'1.2.3.4.5'"]),
        (["--host", "[::1"], 1, ["--host", "'[::1'"]),
        (["--host", "::g"], 1, ["--host", "'::g'"]),
        (["--host", ""], 1, ["--host", "''"]),
        (["--host", "h" * 300], 1, ["--host", "characters)"]),
        (["--host", "no-such-host.invalid"], 1, ["--host", "'no-such-host.invalid'", "cannot be resolved"]),
        (["--host", "no-such-host.invalid", "--allow-remote"], 1, ["cannot be resolved"]),
    ],
)
def test_a_bind_the_lab_refuses_is_one_error_line(args, code, words):
    p = qkv_lab(*args)
    assert p.returncode == code, (p.returncode, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and "Traceback" not in p.stderr, p.stderr
    for word in words:
        assert word in lines[0], (word, lines[0])
    assert p.stdout == ""


def test_allow_remote_serves_with_a_loud_warning_and_still_checks_hosts():
    with lab_process("--host", "0.0.0.0", "--allow-remote") as (url, proc):
        port = port_of(url)
        assert exchange(port, http("GET", "/api/limits", f"127.0.0.1:{port}"))[0] == 200
        assert exchange(port, http("GET", "/api/limits", f"10.1.2.3:{port}"))[0] == 200  # by address: no rebinding
        assert exchange(port, http("GET", "/api/limits", f"evil.example:{port}"))[0] == 400
        proc.terminate()
        proc.wait(10)
        warning = proc.stderr.read()
    assert "WARNING" in warning and "0.0.0.0" in warning and "no authentication" in warning


def test_a_loopback_name_needs_no_flag():
    with lab_server("--host", "localhost") as url:
        assert url.startswith("http://localhost:")
        assert exchange(port_of(url), http("GET", "/api/limits", "localhost"))[0] == 200


def test_every_safety_limit_is_served_and_documented():
    from dataclasses import fields
    from pathlib import Path

    names = [f.name for f in fields(Limits)]
    safety = names[names.index("max_runs") :]
    doc = (Path(__file__).resolve().parents[1] / "docs" / "lab.md").read_text().split("## Limits and safety")[1]
    with TestClient(create_app()) as c:
        served = c.get("/api/limits").json()
    for name in safety:
        assert f"`{name}`" in doc, name
        assert served[name] == getattr(LIMITS, name), name


@pytest.mark.parametrize(
    ("pairs", "n", "block", "status", "series_top"),
    [
        (1 << 12, 64, 1, 200, 64),  # 64 x 64 pairs: answered; the curve stops before 128 x 128
        (1 << 12, 64, 2, 200, 128),
        (1 << 12, 128, 1, 422, None),
        (1 << 24, 8192, 1, 422, None),  # a lab configured below the default refuses at once
        (LIMITS.max_bigbird_block_pairs, 8192, 1, 200, 8192),  # block=1 at the largest N: counted quickly
    ],
)
def test_the_calculator_bounds_bigbird_block_pairs(pairs, n, block, status, series_top):
    with TestClient(create_app(limits=Limits(max_bigbird_block_pairs=pairs))) as c:
        t0 = time.monotonic()
        r = c.post("/api/complexity", json={"n": n, "mask": "bigbird", "mask_params": {"block": block}})
    assert r.status_code == status, r.text[:300]
    if status == 200:
        assert max(p["n"] for p in r.json()["series"]) == series_top
    else:
        message = r.json()["message"]
        assert f"block={block}" in message and f"N={n}" in message and f"max_bigbird_block_pairs={pairs}" in message
        assert time.monotonic() - t0 < 1.0
