"""Training runs of the lab: ``qkv.train.train`` in a background thread, one run per client.

- ``recording``: what a run keeps, compactly (``quantize``, ``frame_json``, ``Frames``): loss and
  accuracy per step, and at most ``Limits.max_frames_per_run`` attention maps as ``uint16``.
- ``runs``: a ``Run`` (its records, its viewers, stopping it) and the body of its thread.
- ``streams``: the text its viewers are sent, written from its records when asked (server-sent
  events, the scrubber's summary).
- ``manager``: ``TrainingManager``, the runs of every client within the lab's limits.

No FastAPI here.
"""

from .manager import TrainingManager as TrainingManager
from .recording import NONFINITE as NONFINITE
from .recording import UNIT as UNIT
from .recording import Frames as Frames
from .recording import frame_json as frame_json
from .recording import quantize as quantize
from .runs import TERMINAL as TERMINAL
from .runs import Run as Run
