"""Two "hosts" on one machine: ring attention with torchrun across network namespaces.

Each host is a network namespace (``ip netns add``) with its own loopback and one end of a
veth pair (10.213.7.1/24 and .2, created inside the namespaces, so nothing appears on the
machine's own network). ``torchrun --nnodes=2 --node-rank=N`` runs ``_multihost_ring.py`` in
each, rendezvous on node 0's veth address, gloo over TCP between them (``GLOO_SOCKET_IFNAME``
names the veth end). The test checks the ring against ``qkv.attention`` in one process, then
cuts host A off mid-run — its link deleted, then its processes killed, so no FIN or RST ever
reaches host B, as when a machine loses power — and requires host B to end, with a
``DistributedError`` naming the call, within the process group's timeout plus a margin.

Needs root and ``ip netns`` (iproute2); skips with the reason otherwise. The namespaces and
everything running in them are removed afterwards, also when the test fails.
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from helpers import HAS_TORCH

pytestmark = pytest.mark.skipif(not HAS_TORCH, reason="qkv.distributed needs torch")

ROOT = Path(__file__).resolve().parents[1]
WORKER = ROOT / "tests" / "_multihost_ring.py"
SUBNET = "10.213.7"  # private to the two namespaces: they have no other interface
GROUP_TIMEOUT = 10  # seconds: init_process_group(timeout=...) in the worker
RDZV_TIMEOUT = 60  # seconds: torchrun's static rendezvous waits this long for the other host
START_BUDGET = 150  # seconds for both hosts to start torch and finish the first check (2 busy cores)
FAIL_BUDGET = GROUP_TIMEOUT + 25  # after the cut: the group timeout, then torchrun's own exit


def _ip(*args, check=True):
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=check)


def _why_no_namespaces():
    """None if this process can make network namespaces, else why not."""
    if os.geteuid() != 0:
        return "needs root to create network namespaces (ip netns add)"
    if shutil.which("ip") is None:
        return "needs the ip command (iproute2) for network namespaces"
    probe = f"qkv-probe-{os.getpid()}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode:
        return f"ip netns add failed: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


class Host:
    """One namespace, its end of the veth pair, and the torchrun started in it."""

    def __init__(self, ns, ifname, addr, log):
        self.ns, self.ifname, self.addr, self.log = ns, ifname, addr, log
        self.proc = None

    def pids(self):
        got = _ip("netns", "pids", self.ns, check=False)
        return [int(p) for p in got.stdout.split()] if got.returncode == 0 else []

    def kill(self):
        """SIGKILL what runs in this namespace (all of it started by this test)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def text(self):
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@pytest.fixture
def hosts(tmp_path):
    why = _why_no_namespaces()
    if why:
        pytest.skip(why)
    tag = f"qkv-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    a = Host(f"{tag}-a", "qkv0", f"{SUBNET}.1", tmp_path / "host-a.log")
    b = Host(f"{tag}-b", "qkv1", f"{SUBNET}.2", tmp_path / "host-b.log")
    try:
        for h in (a, b):
            _ip("netns", "add", h.ns)
            _ip("-n", h.ns, "link", "set", "lo", "up")
        _ip("link", "add", a.ifname, "netns", a.ns, "type", "veth", "peer", "name", b.ifname, "netns", b.ns)
        for h in (a, b):
            _ip("-n", h.ns, "addr", "add", f"{h.addr}/24", "dev", h.ifname)
            _ip("-n", h.ns, "link", "set", h.ifname, "up")
        yield a, b
    finally:
        for h in (a, b):
            h.kill()
        for h in (a, b):
            if h.proc is not None:
                h.proc.wait(timeout=30)
            _ip("netns", "del", h.ns, check=False)  # also removes the veth pair


def _torchrun(host, node_rank, master, port):
    env = {
        **os.environ,
        "GLOO_SOCKET_IFNAME": host.ifname,  # gloo would otherwise pick the address the hostname resolves to
        "QKV_HOST": host.ns,
        "OMP_NUM_THREADS": "1",
        "PYTHONWARNINGS": "error",
    }
    cmd = [
        "ip", "netns", "exec", host.ns,
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes=2", "--nproc-per-node=1", f"--node-rank={node_rank}",
        f"--master-addr={master.addr}", f"--master-port={port}",
        f"--rdzv-conf=timeout={RDZV_TIMEOUT}", "--max-restarts=0",
        str(WORKER), f"--timeout={GROUP_TIMEOUT}", "--keep-going",
    ]  # fmt: skip
    with host.log.open("wb") as log:
        host.proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT, start_new_session=True
        )


def _wait_for(predicate, budget, what, hosts):
    deadline = time.monotonic() + budget
    while not predicate():
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {h.ns}\n{h.text()[-3000:]}" for h in hosts)
            pytest.fail(f"{what} did not happen within {budget} s\n{logs}")
        time.sleep(0.2)


def test_ring_across_two_namespaces_is_exact_and_a_lost_host_ends_the_other_with_a_clear_error(hosts):
    a, b = hosts
    for rank, h in enumerate((a, b)):
        _torchrun(h, rank, a, 29500)
    checked = re.compile(r"rank \d of 2 on (\S+): ring attention vs one process: max \|error\| = (\S+)")

    def both_running():
        for h in (a, b):
            if h.proc.poll() is not None:
                pytest.fail(f"{h.ns} exited early with {h.proc.returncode}:\n{h.text()[-3000:]}")
        return all(": round 1\n" in h.text() for h in (a, b))

    _wait_for(both_running, START_BUDGET, "both hosts checking the ring and running it", (a, b))
    for h in (a, b):
        found = checked.search(h.text())
        assert found and found.group(1) == h.ns, h.text()[-3000:]
        assert float(found.group(2)) <= 1e-10, f"{h.ns}: ring differs from one process by {found.group(2)}"

    _ip("-n", a.ns, "link", "del", a.ifname)  # host A drops off the network: no FIN, no RST
    a.kill()
    cut = time.monotonic()
    try:
        b.proc.wait(timeout=FAIL_BUDGET)
    except subprocess.TimeoutExpired:
        pytest.fail(f"host B still running {FAIL_BUDGET} s after host A was cut off:\n{b.text()[-3000:]}")
    took = time.monotonic() - cut
    log = b.text()
    failed = re.search(r"rank 1: FAILED after (\d+) rounds, (\S+) s after the last good one: (.*)", log)
    assert b.proc.returncode != 0 and failed, log[-3000:]
    assert failed.group(3).startswith("DistributedError: ring_attention: "), failed.group(3)
    assert "a rank of the group died, stopped calling or timed out" in failed.group(3), failed.group(3)
    # it waited for the group's timeout (no connection reset told it earlier), and no longer than that by much
    assert GROUP_TIMEOUT - 1 <= float(failed.group(2)) <= GROUP_TIMEOUT + 10, failed.group(0)
    assert took <= FAIL_BUDGET, took
