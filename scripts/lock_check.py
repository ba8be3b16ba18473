"""What in this environment differs from the lock (constraints.txt): one line per finding, nothing
when it matches. Run by scripts/setup with the venv's Python (tests/test_lock.py checks the same
facts on its own, and runs this script on a made-up environment).

    python scripts/lock_check.py constraints.txt

Findings: torch that is not the CPU build the lock stands for (PyPI's ``torch==2.13.0`` is the
CUDA build, with multi-gigabyte ``nvidia-*`` wheels), a locked package at another version, a
package the lock does not name (pip itself and qkv excepted).
"""

import re
import sys
from importlib import metadata
from pathlib import Path

CPU_INDEX = "https://download.pytorch.org/whl/cpu"
NOT_LOCKED = {"pip", "qkv"}  # the installer and the package itself


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(lock: str) -> dict[str, str]:
    return {canonical(n): v for n, v in re.findall(r"^([A-Za-z0-9_.-]+)==([^\s;#]+)", lock, re.MULTILINE)}


def installed() -> dict[str, str]:
    """Every distribution on ``sys.path``: the first one found wins, as for imports."""
    out: dict[str, str] = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name:
            out.setdefault(canonical(name), dist.version)
    return out


def findings(lock: str, have: dict[str, str]) -> list[str]:
    want = pins(lock)
    out = []
    torch = have.get("torch")
    if torch is not None and "torch" in want and not torch.endswith("+cpu"):
        cuda = sorted(n for n in have if n.startswith("nvidia-"))
        out.append(
            f"torch {torch} is not the locked CPU build (torch=={want['torch']}+cpu)"
            + (f", and brought {len(cuda)} nvidia-* packages" if cuda else "")
            + f": pip install --force-reinstall --no-deps torch=={want['torch']} --index-url {CPU_INDEX}"
        )
    wrong = {n: (v, want[n]) for n, v in have.items() if n in want and v.split("+")[0] != want[n]}
    if wrong:
        out.append(
            "locked packages at other versions (installed, locked): " + ", ".join(f"{n} {v}" for n, v in wrong.items())
        )
    extra = sorted(n for n in have if n not in want and n not in NOT_LOCKED)
    if extra:
        out.append(f"{len(extra)} packages outside the lock: " + ", ".join(f"{n} {have[n]}" for n in extra))
    return out


if __name__ == "__main__":
    for line in findings(Path(sys.argv[1]).read_text(), installed()):
        print(f"setup: {line}")
