"""The CPU this process runs on: its name, its vendor's family and model numbers, and the
microarchitecture they stand for, read without running anything (Linux ``/proc/cpuinfo``,
Windows' processor string, macOS ``sysctl``).

The vendor's family/model numbers name the core design more reliably than the marketing name
(a cloud VM may report only "AMD EPYC"); the table below maps the ones qkv's benchmarks care
about, the ranges as the Linux kernel assigns them (``arch/x86/kernel/cpu/amd.c`` for the Zen
generations, ``arch/x86/include/asm/intel-family.h`` for Intel's family 6).
"""

import os
import platform
import re
import subprocess
from typing import NamedTuple


class Cpu(NamedTuple):
    """``model``: the vendor's name for the part; ``vendor``; ``family`` / ``number``: the vendor's
    family and model numbers (None where the platform does not say); ``microarchitecture``: the
    core design they stand for ("" when not in qkv's table)."""

    model: str
    vendor: str
    family: int | None
    number: int | None
    microarchitecture: str

    def describe(self) -> str:
        """``AMD EPYC (Zen 4; AuthenticAMD family 25 model 17)``: the name, then what it is."""
        ids = f"family {self.family} model {self.number}" if self.family is not None else ""
        detail = "; ".join(x for x in (self.microarchitecture, " ".join(x for x in (self.vendor, ids) if x)) if x)
        return f"{self.model} ({detail})" if detail else self.model


# (first model, last model, name) per AMD family: the kernel's X86_FEATURE_ZEN* ranges
_AMD: dict[int, tuple[tuple[int, int, str], ...]] = {
    0x17: ((0x00, 0x2F, "Zen"), (0x50, 0x5F, "Zen"), (0x30, 0x4F, "Zen 2"), (0x60, 0x7F, "Zen 2"),
           (0x90, 0x91, "Zen 2"), (0xA0, 0xAF, "Zen 2")),
    0x19: ((0x00, 0x0F, "Zen 3"), (0x20, 0x5F, "Zen 3"), (0x10, 0x1F, "Zen 4"), (0x60, 0xAF, "Zen 4")),
    0x1A: ((0x00, 0x0F, "Zen 5"), (0x20, 0x2F, "Zen 5"), (0x40, 0x4F, "Zen 5"), (0x70, 0x7F, "Zen 5")),
}  # fmt: skip

# Intel family 6 model -> core design (the server parts, then the client parts since Haswell)
_INTEL6: dict[int, str] = {
    0x3F: "Haswell-X", 0x4F: "Broadwell-X", 0x56: "Broadwell-D", 0x55: "Skylake-X",
    0x6A: "Ice Lake-X", 0x6C: "Ice Lake-D", 0x8F: "Sapphire Rapids", 0xCF: "Emerald Rapids",
    0xAD: "Granite Rapids", 0xAE: "Granite Rapids-D", 0xAF: "Sierra Forest",
    0x3C: "Haswell", 0x45: "Haswell", 0x46: "Haswell", 0x3D: "Broadwell", 0x47: "Broadwell",
    0x4E: "Skylake", 0x5E: "Skylake", 0x8E: "Kaby Lake", 0x9E: "Kaby Lake", 0xA5: "Comet Lake",
    0xA6: "Comet Lake", 0x66: "Cannon Lake", 0x7D: "Ice Lake", 0x7E: "Ice Lake", 0xA7: "Rocket Lake",
    0x8C: "Tiger Lake", 0x8D: "Tiger Lake", 0x97: "Alder Lake", 0x9A: "Alder Lake", 0xB7: "Raptor Lake",
    0xBA: "Raptor Lake", 0xBF: "Raptor Lake", 0xAA: "Meteor Lake", 0xAC: "Meteor Lake",
    0xBD: "Lunar Lake", 0xC5: "Arrow Lake", 0xC6: "Arrow Lake",
}  # fmt: skip


def microarchitecture(vendor: str, family: int | None, number: int | None, stepping: int | None = None) -> str:
    """The core design of an x86 part from its vendor's family and model numbers ("" if unknown)."""
    if family is None or number is None:
        return ""
    if vendor == "AuthenticAMD":
        return next((name for lo, hi, name in _AMD.get(family, ()) if lo <= number <= hi), "")
    if vendor == "GenuineIntel" and family == 6:
        name = _INTEL6.get(number, "")
        if number == 0x55 and stepping is not None:  # one model number, three server generations
            name = "Cascade Lake" if 5 <= stepping <= 7 else "Cooper Lake" if stepping >= 10 else name
        return name
    return ""


def _int(text: str | None, base: int = 10) -> int | None:
    try:
        return int(text, base) if text is not None else None
    except ValueError:
        return None


def from_cpuinfo(text: str) -> Cpu:
    """The first processor of a Linux ``/proc/cpuinfo`` (x86: vendor_id, cpu family, model; arm64:
    CPU implementer / CPU part, in hex)."""
    first: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            if first:
                break
            continue
        key, _, value = line.partition(":")
        first.setdefault(key.strip(), value.strip())
    if "vendor_id" in first:
        vendor = first["vendor_id"]
        family, number = _int(first.get("cpu family")), _int(first.get("model"))
        arch = microarchitecture(vendor, family, number, _int(first.get("stepping")))
        return Cpu(first.get("model name", platform.processor()), vendor, family, number, arch)
    implementer, part = _int(first.get("CPU implementer"), 16), _int(first.get("CPU part"), 16)
    vendor = f"implementer {implementer:#x}" if implementer is not None else ""
    model = first.get("model name") or (f"part {part:#x}" if part is not None else "") or platform.machine()
    return Cpu(model, vendor, None, None, "")


def from_windows(text: str) -> Cpu:
    """``platform.processor()`` on Windows: ``Intel64 Family 6 Model 85 Stepping 7, GenuineIntel``."""
    m = re.search(r"Family (\d+) Model (\d+)(?: Stepping (\d+))?, (\w+)", text)
    if m is None:
        return Cpu(text or platform.machine(), "", None, None, "")
    family, number, stepping = int(m[1]), int(m[2]), _int(m[3])
    return Cpu(text, m[4], family, number, microarchitecture(m[4], family, number, stepping))


def _sysctl(name: str) -> str:
    try:
        r = subprocess.run(["sysctl", "-n", name], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return ""
    return r.stdout.strip() if r.returncode == 0 else ""


def cpu() -> Cpu:
    """This machine's CPU, as far as the platform says."""
    if os.path.exists("/proc/cpuinfo"):
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
                return from_cpuinfo(f.read())
        except OSError:
            pass
    if platform.system() == "Windows":
        return from_windows(platform.processor())
    if platform.system() == "Darwin":
        name = _sysctl("machdep.cpu.brand_string")
        family = _int(_sysctl("machdep.cpu.family") or None)
        number = _int(_sysctl("machdep.cpu.model") or None)
        vendor = _sysctl("machdep.cpu.vendor")
        return Cpu(name or platform.machine(), vendor, family, number, microarchitecture(vendor, family, number))
    return Cpu(platform.processor() or platform.machine(), "", None, None, "")
