"""ckview: record a PyTorch training step, see what fills memory, plan gradient checkpointing."""

__version__ = "0.1.0"
