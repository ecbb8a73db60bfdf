"""Record training steps into a ckview trace (needs torch).

>>> from recorder import Recorder
>>> with Recorder("trace.h5", steps=2, warmup=1):
...     train()
"""

from recorder.run import RecordingResult, RecordOptions, record
from recorder.runner import Outcome, SignalExit, run_script
from recorder.runs import RunSpec, StopScript
from recorder.session import Recorder

__all__ = [
    "Outcome",
    "RecordOptions",
    "Recorder",
    "RecordingResult",
    "RunSpec",
    "SignalExit",
    "StopScript",
    "record",
    "run_script",
]
