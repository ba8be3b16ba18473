"""Keys and values in 8 bits: ``quantize``, ``dequantize`` and the ``Quantized`` record.

``_formats`` (the int8 / float8 formats; float8 bit patterns in NumPy), ``_quantize`` (the
record and its ``append``, the rounding rule). ``qkv.attention`` reads a
``Quantized`` in place of ``k`` and ``v``; ``qkv.nn.KVCache(dtype=...)`` and
``qkv.integrations.transformers.QuantizedCache`` store their caches this way.
"""

from ._formats import FORMATS as FORMATS
from ._formats import SCALES as SCALES
from ._formats import Format as Format
from ._formats import check_format as check_format
from ._quantize import Quantized as Quantized
from ._quantize import dequantize as dequantize
from ._quantize import quantize as quantize
