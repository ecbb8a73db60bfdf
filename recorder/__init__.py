"""Record training steps into a ckview trace (needs torch).

>>> from recorder import Recorder
>>> with Recorder("trace.h5", steps=2, warmup=1):
...     train()
"""

from recorder.runner import Outcome, SignalExit, run_script
from recorder.session import Recorder, RunSpec, StopScript

__all__ = ["Outcome", "Recorder", "RunSpec", "SignalExit", "StopScript", "run_script"]
