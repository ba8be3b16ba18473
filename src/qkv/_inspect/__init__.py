"""``qkv.inspect``: look inside a real transformers model on your own text.

One forward pass through qkv's transformers backend (``qkv.integrations.transformers``) with
the weights captured (``_capture``); what it returns is an ``Inspection`` (``_inspection``):
the weights of every layer and head, their entropy, each head's computed pattern
(``_patterns``), attention rollout (``_rollout``) and what a sparse or linear approximation
would lose on this input (``_approx``). Importing this package imports neither torch nor
transformers: ``_model`` does when a model is loaded.
"""

from ._approx import METHODS as METHODS
from ._approx import Approximations as Approximations
from ._errors import INSTALL as INSTALL
from ._errors import MissingExtra as MissingExtra
from ._errors import ModelError as ModelError
from ._inspection import HeadSummary as HeadSummary
from ._inspection import Inspection as Inspection
from ._model import DEFAULT_MODEL as DEFAULT_MODEL
from ._model import MAX_TOKENS as MAX_TOKENS
from ._model import LoadedModel as LoadedModel
from ._model import load_model as load_model
from ._patterns import PATTERNS as PATTERNS
from ._patterns import head_patterns as head_patterns
from ._patterns import pattern_scores as pattern_scores
from ._rollout import rollout as rollout
from ._run import check_text as check_text
from ._run import inspect as inspect

__all__ = [
    "DEFAULT_MODEL",
    "INSTALL",
    "MAX_TOKENS",
    "METHODS",
    "PATTERNS",
    "Approximations",
    "HeadSummary",
    "Inspection",
    "LoadedModel",
    "MissingExtra",
    "ModelError",
    "check_text",
    "head_patterns",
    "inspect",
    "load_model",
    "pattern_scores",
    "rollout",
]
