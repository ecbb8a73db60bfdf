"""The checkpointing runtime (checkpoint, checkpoint_sequential, apply_plan, bypass).

Imports torch only. Filled in by the runtime issue; the recorder already cooperates with
``torch.utils.checkpoint`` (see recorder/session.py, NOTE [ Cooperating with other
saved-tensor hooks ]).
"""
