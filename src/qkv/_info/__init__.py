"""``qkv.info()``: what qkv found on this machine (``_gather``) and the CPU it runs on (``_cpu``)."""

from ._cpu import Cpu as Cpu
from ._cpu import cpu as cpu
from ._cpu import from_cpuinfo as from_cpuinfo
from ._cpu import from_windows as from_windows
from ._cpu import microarchitecture as microarchitecture
from ._gather import LIBRARIES as LIBRARIES
from ._gather import Feature as Feature
from ._gather import Info as Info
from ._gather import fresh_line as fresh_line
from ._gather import info as info
