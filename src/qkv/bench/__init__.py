"""Benchmarks for qkv: timing, interleaved comparison, peak memory and named suites.

Measures, never prints (``qkv bench`` and ``benchmarks/`` print). On a shared, noisy
machine absolute times drift, so candidates are compared as ratios measured interleaved in one
run (A B C A B C ..., ``compare``), summarised by medians and interquartile ranges. Torch is
imported only inside the functions that need it.

    >>> from qkv.bench import measure, compare, run_suite
    >>> measure(lambda: sum(range(10_000)), repeats=5).median
    >>> rows = run_suite("quick", quick=True)     # list of dicts, one per (workload, N, mode, impl)
"""

from ._competitors import COMPETITORS as COMPETITORS
from ._competitors import Unavailable as Unavailable
from ._competitors import naive_attention as naive_attention
from ._memory import Memory as Memory
from ._memory import matmul_rate as matmul_rate
from ._memory import measure_attention as measure_attention
from ._memory import peak_memory as peak_memory
from ._run import run_case as run_case
from ._suites import SUITE_NAMES as SUITE_NAMES
from ._suites import SUITES as SUITES
from ._suites import run_suite as run_suite
from ._targets import TARGET_GROUPS as TARGET_GROUPS
from ._timing import Ratio as Ratio
from ._timing import Timing as Timing
from ._timing import compare as compare
from ._timing import measure as measure
from ._timing import paired_ratios as paired_ratios
from ._workloads import MODES as MODES
from ._workloads import WORKLOADS as WORKLOADS
from ._workloads import Workload as Workload
from ._workloads import allowed_entries as allowed_entries
from ._workloads import flops as flops
from ._workloads import make_inputs as make_inputs
from ._workloads import workload as workload

__all__ = [
    "COMPETITORS",
    "SUITES",
    "SUITE_NAMES",
    "WORKLOADS",
    "Memory",
    "Ratio",
    "Timing",
    "Unavailable",
    "Workload",
    "allowed_entries",
    "compare",
    "flops",
    "make_inputs",
    "measure",
    "naive_attention",
    "paired_ratios",
    "peak_memory",
    "run_case",
    "run_suite",
    "workload",
]
