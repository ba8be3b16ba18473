"""``qkv.info()``: what qkv found on this machine, gathered once per call.

Each engine is asked itself rather than inferred: the compiled kernel by loading it, the torch
operator by registering it, the JAX handlers by handing them to JAX. So ``info()`` imports torch
and JAX when they are installed (and only then); versions come from the installed distributions'
metadata, without importing anything.
"""

import dataclasses
import os
import platform
import subprocess
import sys
from importlib import metadata
from typing import Any, NamedTuple

from .. import _native as native
from .._impls import handler_reason, operator_reason, threads
from .._version import __version__
from ._cpu import Cpu, cpu

LIBRARIES = ("numpy", "torch", "jax", "jaxlib", "transformers")
"""The distributions whose versions ``Info.versions`` reports (None: not installed)."""


class Feature(NamedTuple):
    """Whether a part of qkv is there; ``reason`` says why not ("" when it is)."""

    present: bool
    reason: str = ""

    def __str__(self) -> str:
        return "yes" if self.present else f"no: {self.reason}"


@dataclasses.dataclass(frozen=True)
class Info:
    """What qkv found on this machine (``qkv.info()``; ``qkv info`` prints it).

    ``isa``: the compiled kernel's instruction-set path in use, ``isas``: the ones this CPU runs,
    best first (both empty without the kernel); ``threads``: the kernel's worker count in this
    process as of the call (torch's when torch is loaded, else ``OMP_NUM_THREADS``, else the CPUs
    the process may use); ``native``, ``torch_operator``, ``jax_ffi``: the compiled engine, the
    ``torch.ops.qkv.attention`` operator and the ``jax.jit`` handlers, each with why not.
    ``str(info)`` is a short report, ``info.line()`` one line for logs and benchmark headers,
    ``info.to_dict()`` the same facts as JSON-ready values.
    """

    version: str
    python: str
    platform: str
    cpu: Cpu
    cpus: int | None
    threads: int
    isa: str
    isas: tuple[str, ...]
    native: Feature
    torch_operator: Feature
    jax_ffi: Feature
    versions: dict[str, str | None]

    def line(self) -> str:
        """One line: ``qkv 0.1.0 | AMD EPYC (Zen 4; AuthenticAMD family 25 model 17) | isa avx512bf16
        of avx512bf16,avx512,avx2,portable | kernel yes, torch op yes, jax ffi yes | 2 threads of 2
        CPUs | python 3.11.7, numpy 2.4.6, torch 2.13.0+cpu, jax 0.10.2, ...``."""
        isa = f"isa {self.isa} of {','.join(self.isas)}" if self.native.present else "isa none"
        yes = {True: "yes", False: "no"}
        parts = (
            f"kernel {yes[self.native.present]}",
            f"torch op {yes[self.torch_operator.present]}",
            f"jax ffi {yes[self.jax_ffi.present]}",
        )
        libs = ", ".join(f"{name} {v or 'absent'}" for name, v in self.versions.items())
        return (
            f"qkv {self.version} | {self.cpu.describe()} | {isa} | {', '.join(parts)} | "
            f"{self.threads} threads of {self.cpus} CPUs | python {self.python}, {libs}"
        )

    def __str__(self) -> str:
        rows = (
            ("qkv", f"{self.version} (Python {self.python}, {self.platform})"),
            ("CPU", f"{self.cpu.describe()}, {self.cpus} CPUs"),
            ("ISA path", f"{self.isa} (this CPU runs: {', '.join(self.isas)})" if self.native.present else "none"),
            ("kernel", str(self.native)),
            ("torch op", str(self.torch_operator)),
            ("JAX FFI", str(self.jax_ffi)),
            ("threads", str(self.threads)),
            ("versions", ", ".join(f"{name} {v or 'absent'}" for name, v in self.versions.items())),
        )
        return "\n".join(f"{key:<9} {value}" for key, value in rows)

    def to_dict(self) -> dict[str, Any]:
        """The facts as JSON-ready values (``qkv info --json``)."""
        out = dataclasses.asdict(self)
        out["cpu"] = self.cpu._asdict()
        out["isas"] = list(self.isas)
        for key in ("native", "torch_operator", "jax_ffi"):
            out[key] = getattr(self, key)._asdict()
        return out


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _feature(why: str | None) -> Feature:
    return Feature(why is None, why or "")


def info() -> Info:
    """What qkv found on this machine: the CPU and the kernel's ISA paths, which engines are
    there (and why not), threads and versions. Imports torch and JAX when they are installed.

        >>> print(qkv.info())
        qkv       0.1.0 (Python 3.11.7, Linux x86_64)
        CPU       AMD EPYC (Zen 4; AuthenticAMD family 25 model 17), 2 CPUs
        ISA path  avx512bf16 (this CPU runs: avx512bf16, avx512, avx2, portable)
        kernel    yes
        ...
    """
    workers = threads()  # before torch is imported below: the count this process uses as called
    here = native.available()
    return Info(
        version=__version__,
        python=platform.python_version(),
        platform=f"{platform.system()} {platform.machine()}",
        cpu=cpu(),
        cpus=os.cpu_count(),
        threads=workers,
        isa=native.isa() if here else "",
        isas=native.isas() if here else (),
        native=_feature(None if here else native.reason()),
        torch_operator=_feature(operator_reason()),
        jax_ffi=_feature(handler_reason()),
        versions={name: _version(name) for name in LIBRARIES},
    )


def fresh_line(timeout: float = 300) -> str:
    """``info().line()`` as a new interpreter finds it, leaving this process as it is: the benchmarks'
    and ``qkv bench``'s header (``info()`` imports torch and JAX, and a loaded JAX adds a check to
    every call's array dispatch, which a benchmark of microseconds would measure)."""
    code = "import qkv; print(qkv.info().line())"
    try:
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError) as e:
        return f"qkv {__version__} | qkv.info() did not finish: {type(e).__name__}: {e}"
    if r.returncode != 0:
        tail = (r.stderr.strip().splitlines() or [f"exit code {r.returncode}"])[-1]
        return f"qkv {__version__} | qkv.info() failed: {tail}"
    return r.stdout.strip()
