"""``qkv.explain`` and its ``Trace``: attention replayed step by step, every intermediate kept.

``_replay`` runs the reference implementation's own step functions and records each value;
``_trace`` holds the record (``Step``, ``Trace``); ``_render`` draws it as text or HTML.
"""

from ._replay import EXAMPLE as EXAMPLE
from ._replay import explain as explain
from ._trace import Step as Step
from ._trace import Trace as Trace

__all__ = ["EXAMPLE", "Step", "Trace", "explain"]
