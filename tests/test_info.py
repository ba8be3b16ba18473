"""``qkv.info()`` / ``qkv info``: each fact checked against its own source — the CPU against
``/proc/cpuinfo`` read here, the ISA paths against ``qkv._native``, the threads against the plan
``qkv.dispatch`` makes, the engines against torch and JAX themselves (the operator resolves, the
jitted program holds the custom call), the versions against the modules — and the processes it
must leave alone (no torch or JAX imported where they are not installed, or by ``fresh_line``)."""

import importlib.util
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import qkv
from qkv import _native
from qkv._info import Cpu, from_cpuinfo, from_windows, microarchitecture

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def found():
    return qkv.info()


def run_python(code):
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


# ------------------------------------------------------------------------------------------ the CPU


@pytest.mark.skipif(not Path("/proc/cpuinfo").exists(), reason="no /proc/cpuinfo: not Linux")
def test_the_cpu_is_the_first_processor_of_proc_cpuinfo(found):
    text = Path("/proc/cpuinfo").read_text()
    first = text.split("\n\n")[0]

    def field(name):
        m = re.search(rf"^{name}\s*:\s*(.*)$", first, re.M)
        return m.group(1).strip() if m else None

    if field("vendor_id") is None:  # arm64: no vendor_id / cpu family
        assert found.cpu.family is None
        return
    assert found.cpu.model == field("model name")
    assert found.cpu.vendor == field("vendor_id")
    assert (found.cpu.family, found.cpu.number) == (int(field("cpu family")), int(field("model")))
    assert found.cpu.model in found.line() and f"family {found.cpu.family} model {found.cpu.number}" in found.line()


# Published CPUID signatures (family, model[, stepping]) of well-known parts and their core design.
KNOWN = [
    pytest.param("AuthenticAMD", 25, 0x11, None, "Zen 4", id="EPYC-9654-Genoa"),
    pytest.param("AuthenticAMD", 25, 0x61, None, "Zen 4", id="Ryzen-7950X-Raphael"),
    pytest.param("AuthenticAMD", 25, 0x01, None, "Zen 3", id="EPYC-7763-Milan"),
    pytest.param("AuthenticAMD", 25, 0x21, None, "Zen 3", id="Ryzen-5950X-Vermeer"),
    pytest.param("AuthenticAMD", 23, 0x31, None, "Zen 2", id="EPYC-7742-Rome"),
    pytest.param("AuthenticAMD", 23, 0x01, None, "Zen", id="EPYC-7601-Naples"),
    pytest.param("AuthenticAMD", 26, 0x02, None, "Zen 5", id="EPYC-9005-Turin"),
    pytest.param("GenuineIntel", 6, 0x8F, None, "Sapphire Rapids", id="Xeon-8480-SPR"),
    pytest.param("GenuineIntel", 6, 0x6A, None, "Ice Lake-X", id="Xeon-8380-ICX"),
    pytest.param("GenuineIntel", 6, 0x55, 7, "Cascade Lake", id="Xeon-8280-CLX"),
    pytest.param("GenuineIntel", 6, 0x55, 4, "Skylake-X", id="Xeon-8180-SKX"),
    pytest.param("GenuineIntel", 6, 0xB7, None, "Raptor Lake", id="i9-13900K"),
    pytest.param("GenuineIntel", 6, 0x01, None, "", id="Pentium-Pro-not-in-the-table"),
    pytest.param("AuthenticAMD", 21, 0x02, None, "", id="Bulldozer-not-in-the-table"),
    pytest.param("HygonGenuine", 24, 0x01, None, "", id="other-vendor"),
]


@pytest.mark.parametrize("vendor,family,model,stepping,want", KNOWN)
def test_the_microarchitecture_of_known_parts(vendor, family, model, stepping, want):
    assert microarchitecture(vendor, family, model, stepping) == want


def test_proc_cpuinfo_is_read_for_x86_and_arm64():
    x86 = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\nmodel name\t: AMD EPYC\n"
    x86 += "stepping\t: 1\n\nprocessor\t: 1\nvendor_id\t: GenuineIntel\n"
    assert from_cpuinfo(x86) == Cpu("AMD EPYC", "AuthenticAMD", 25, 17, "Zen 4")
    assert (
        Cpu("AMD EPYC", "AuthenticAMD", 25, 17, "Zen 4").describe()
        == "AMD EPYC (Zen 4; AuthenticAMD family 25 model 17)"
    )
    arm = "processor\t: 0\nBogoMIPS\t: 50.00\nCPU implementer\t: 0x41\nCPU part\t: 0xd0c\n\n"
    cpu = from_cpuinfo(arm)
    assert (cpu.vendor, cpu.model, cpu.family, cpu.microarchitecture) == ("implementer 0x41", "part 0xd0c", None, "")
    win = from_windows("Intel64 Family 6 Model 85 Stepping 7, GenuineIntel")
    assert (win.vendor, win.family, win.number, win.microarchitecture) == ("GenuineIntel", 6, 85, "Cascade Lake")


# ------------------------------------------------------------------------------------ the engines


def test_the_isa_paths_and_the_kernel_are_qkv_natives(found):
    assert found.native.present == _native.available()
    if not _native.available():
        assert found.native.reason == _native.reason() and found.isa == "" and found.isas == ()
        return
    assert found.native.reason == ""
    assert found.isa == _native.isa() and found.isas == _native.isas() and found.isas[-1] == "portable"
    assert f"isa {found.isa} of {','.join(found.isas)}" in found.line()


def test_threads_are_the_workers_the_plan_gives_the_kernel(found):
    q = np.zeros((1, 4, 256, 64), np.float32)
    d = qkv.dispatch(q, q, q, impl="flash")
    if d.engine != "native":
        pytest.skip(f"the compiled engine does not run here: {d.reason}")
    assert found.threads == d.threads


def test_the_torch_operator_is_reported_as_torch_finds_it(found):
    if importlib.util.find_spec("torch") is None:
        assert not found.torch_operator.present and "torch is not installed" in found.torch_operator.reason
        return
    import torch

    registered = hasattr(torch.ops.qkv, "attention")
    assert found.torch_operator.present == (registered and _native.available())
    if found.torch_operator.present:  # and it runs: the kernel's output against plain softmax attention
        q = torch.randn(1, 2, 5, 8, dtype=torch.float64)
        out = torch.compile(lambda q: qkv.attention(q, q, q), fullgraph=True, backend="eager")(q)
        want = torch.softmax(q @ q.transpose(-1, -2) / 8**0.5, -1) @ q
        torch.testing.assert_close(out, want)


def test_the_jax_handler_is_there_exactly_when_jit_lowers_to_it(found):
    if importlib.util.find_spec("jax") is None:
        assert not found.jax_ffi.present and "JAX is not installed" in found.jax_ffi.reason
        return
    import jax

    q = jax.numpy.zeros((1, 2, 40, 16), jax.numpy.float32)
    text = jax.jit(lambda q: qkv.attention(q, q, q, causal=True)).lower(q).as_text()
    assert found.jax_ffi.present == ("qkv_attention_forward" in text), found.jax_ffi
    assert found.jax_ffi.present == (_native.available() and hasattr(_native._need(), "ffi_handlers"))
    assert found.jax_ffi.present or found.jax_ffi.reason


def test_versions_are_the_modules_own(found):
    assert found.version == qkv.__version__ and found.python == ".".join(map(str, sys.version_info[:3]))
    for name, version in found.versions.items():
        if importlib.util.find_spec(name) is None:
            assert version is None, name
            continue
        module = __import__(name)
        own = getattr(module, "__version__", None) or getattr(getattr(module, "version", None), "__version__", None)
        assert version == str(own), (name, version, own)
    assert set(found.versions) == {"numpy", "torch", "jax", "jaxlib", "transformers"}


# --------------------------------------------------------------------------- forms and processes


def test_the_three_forms_say_the_same(found):
    d = found.to_dict()
    assert json.loads(json.dumps(d)) == d  # JSON-ready
    assert d["isa"] == found.isa and d["cpu"]["microarchitecture"] == found.cpu.microarchitecture
    assert d["torch_operator"] == {"present": found.torch_operator.present, "reason": found.torch_operator.reason}
    line = found.line()
    assert "\n" not in line and line.startswith(f"qkv {qkv.__version__} | ")
    assert f"{found.threads} threads" in line and all(f"{k} {v or 'absent'}" in line for k, v in found.versions.items())
    text = str(found)
    for key in ("qkv", "CPU", "ISA path", "kernel", "torch op", "JAX FFI", "threads", "versions"):
        assert re.search(rf"^{key}\s", text, re.M), key
    assert str(found.jax_ffi) in text and (found.jax_ffi.present or found.jax_ffi.reason in text)


def test_qkv_info_prints_text_json_and_a_line(found):
    pytest.importorskip("typer")
    from typer.testing import CliRunner

    from qkv.cli import app

    res = CliRunner().invoke(app, ["info", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout) == found.to_dict()
    res = CliRunner().invoke(app, ["info"])
    assert res.exit_code == 0 and res.stdout.strip() == str(found)
    res = CliRunner().invoke(app, ["info", "--line"])
    assert res.exit_code == 0 and res.stdout.strip() == found.line()


def test_without_torch_and_jax_info_imports_neither_and_says_why():
    out = run_python("""
        import json, sys

        class Blocked:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in ("torch", "jax", "jaxlib"):
                    raise ModuleNotFoundError(f"No module named {name!r}")
                return None

        sys.meta_path.insert(0, Blocked())
        from qkv.cli import main
        sys.argv = ["qkv", "info", "--json"]
        try:
            main()
        except SystemExit as e:
            assert not e.code, e.code
        heavy = {m.split(".")[0] for m in sys.modules} & {"torch", "jax", "jaxlib"}
        print(json.dumps(sorted(heavy)))
    """)
    report, heavy = out.strip().rsplit("\n", 1)
    assert json.loads(heavy) == []
    d = json.loads(report)
    assert not d["torch_operator"]["present"] and "torch" in d["torch_operator"]["reason"]
    if d["native"]["present"]:
        assert not d["jax_ffi"]["present"] and d["jax_ffi"]["reason"]


def test_fresh_line_leaves_the_calling_process_as_it_was():
    out = run_python("""
        import sys
        from qkv._info import fresh_line
        line = fresh_line()
        print(sorted({m.split(".")[0] for m in sys.modules} & {"torch", "jax"}))
        print(line)
    """)
    heavy, line = out.strip().split("\n")
    assert heavy == "[]"

    def unthreaded(text):  # the child counts its own threads (no torch loaded there to ask)
        return re.sub(r"\| \d+ threads", "|", text)

    assert unthreaded(line) == unthreaded(qkv.info().line())


def test_every_benchmark_prints_the_info_line():
    """The benchmarks' headers carry ``qkv.info()``'s line: directly, or through ``_report.setup``."""
    missing = [
        p.name
        for p in sorted((ROOT / "benchmarks").glob("*.py"))
        if not p.name.startswith("_") and "fresh_line()" not in p.read_text() and "setup()" not in p.read_text()
    ]
    assert not missing, f"benchmarks without qkv.info()'s line in their header: {missing}"
    assert "fresh_line()" in (ROOT / "benchmarks/_report.py").read_text()
