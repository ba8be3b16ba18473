"""``qkv.train``: teach a ``TinyGPT`` a toy task that needs attention, and watch its attention maps.

Tasks (``TASKS``): ``copy``, ``reverse``, ``sort`` and ``recall`` (associative recall). Each
reaches near-perfect accuracy on a laptop CPU in seconds with the default sizes.

    >>> from qkv.train import train
    >>> history = train("reverse", record_every=50)
    >>> history.eval_accuracy, len(history.attention)

Needs PyTorch (``pip install 'qkv[torch]'``); ``rich`` only for ``progress=True``.
"""

from .loop import History as History
from .loop import Snapshot as Snapshot
from .loop import evaluate as evaluate
from .loop import train as train
from .tasks import TASKS as TASKS
from .tasks import Task as Task
from .tasks import make_batch as make_batch

__all__ = ["TASKS", "History", "Snapshot", "Task", "evaluate", "make_batch", "train"]
