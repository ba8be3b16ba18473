"""A real ``qkv lab`` server for the lab's tests: ``python -m qkv lab --port 0 --json`` in a
subprocess, its URL read from the JSON line it prints once it serves."""

import json
import os
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager


@contextmanager
def lab_process(*args, timeout=30.0):
    """Yield ``(url, process)`` of a lab serving in a subprocess (``http://127.0.0.1:PORT/``)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "qkv", "lab", "--port", "0", "--json", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        line = proc.stdout.readline()  # blocks until the server announces itself (or exits)
        if not line:
            raise RuntimeError(f"qkv lab exited ({proc.wait(5)}): {proc.stderr.read()[-2000:]}")
        url = json.loads(line)["url"]
        deadline = time.monotonic() + timeout
        while True:
            try:
                with urllib.request.urlopen(url + "api/limits", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        yield url, proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        for stream in (proc.stdout, proc.stderr):
            stream.close()


@contextmanager
def lab_server(*args, timeout=30.0):
    """Yield the base URL (``http://127.0.0.1:PORT/``) of a lab serving in a subprocess."""
    with lab_process(*args, timeout=timeout) as (url, _):
        yield url
