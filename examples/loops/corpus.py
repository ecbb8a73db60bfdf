"""The manifest of the training loops in this folder: what each one is and what it runs.

Not a training script: ``tests/test_loops.py`` and ``benchmarks/projection_accuracy.py`` read
it (torch-free), so that both use the same sizes and the same expectations. ``args`` are the
script arguments that make a case, ``quick`` those that keep it small enough for the tests;
``forwards``, ``backwards`` and ``optimizer_steps`` say what ONE iteration of the loop does
with those arguments (top-level forward passes, backward passes, ``optimizer.step()`` calls).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

FOLDER = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Loop:
    name: str
    """Unique name of the case; also the script's name unless ``file`` says otherwise."""
    pattern: str
    quick: tuple[str, ...] = ()
    forwards: int = 1
    backwards: int = 1
    optimizer_steps: int = 1
    checkpoint: bool = False
    """The script has ``--checkpoint``: its own checkpointing."""
    bypassable: bool = True
    """ckview can switch the script's own checkpointing off (False: a hand-written Function)."""
    no_effect: dict[str, str] = field(default_factory=dict)
    """Preset plans that cannot take effect on this loop as the plain script runs, and why."""
    no_effect_checkpoint: dict[str, str] = field(default_factory=dict)
    """The same with ``--checkpoint``."""
    plans: tuple[str, ...] = ("none", "sqrt", "all")
    """The preset plans to verify (a model without a chain of blocks has no sqrt or all)."""
    settle: int = 0
    """Warmup iterations the recorder may add until the loop settles (a DataLoader with
    workers: NOTE [ A data pipeline that settles ] in recorder/steady.py); the script is given
    that many more steps."""

    file: str = ""
    """The script's name without ``.py`` when it differs from ``name``."""
    args: tuple[str, ...] = ()
    """Script arguments that make this case (a variant of a shared script), always passed;
    ``quick`` only shrinks it."""

    @property
    def script(self) -> Path:
        return FOLDER / f"{self.file or self.name}.py"


LOOPS: tuple[Loop, ...] = (
    Loop("hf_bert", "HF BertForMaskedLM from a BertConfig, AdamW", ("--layers", "2")),
    Loop(
        "hf_llama",
        "HF LlamaForCausalLM from a LlamaConfig, AdamW; --checkpoint: HF gradient checkpointing",
        ("--layers", "2"),
        checkpoint=True,
    ),
    Loop("hf_trainer", "HF Trainer (max_steps, in-memory dataset) on a tiny BERT classifier"),
    Loop(
        "lightning_module",
        "Lightning Trainer, automatic optimization: forward inside optimizer.step(closure)",
        ("--hidden", "256"),
    ),
    Loop(
        "lightning_residual",
        "Lightning Trainer, automatic optimization, a residual MLP in an nn.Sequential, AdamW",
        ("--hidden", "128"),
        file="lightning_module",
        args=("--residual", "6"),
    ),
    Loop(
        "densenet",
        "DenseNet-BC with BatchNorm; --checkpoint: torch.utils.checkpoint per dense layer",
        ("--batch-size", "8"),
        checkpoint=True,
    ),
    Loop(
        "densenet_efficient",
        "DenseNet whose checkpointing is a hand-written autograd.Function (recompute in backward)",
        ("--batch-size", "8"),
        checkpoint=True,
        bypassable=False,
    ),
    Loop(
        "grad_accumulation",
        "gradient accumulation: 4 micro-batches, then optimizer.step() / zero_grad()",
        forwards=4,
        backwards=4,
    ),
    Loop(
        "gan",
        "GAN: discriminator step then generator step, two Adam optimizers",
        ("--hidden", "128"),
        forwards=4,  # G(z), D(real), D(fake.detach()), D(fake)
        backwards=2,
        optimizer_steps=2,
    ),
    Loop(
        "manual_sgd",
        "no optimizer: p -= lr * p.grad under torch.no_grad()",
        ("--hidden", "256"),
        optimizer_steps=0,
    ),
    Loop(
        "functional",
        "no nn.Module: an MLP written as a function of plain tensors, Adam",
        plans=("none",),
    ),
    Loop(
        "functional_sgd",
        "no nn.Module and no optimizer: plain tensors, updated by hand under torch.no_grad()",
        optimizer_steps=0,
        plans=("none",),
        file="functional",
        args=("--manual",),
    ),
    Loop(
        "lbfgs",
        "L-BFGS: optimizer.step(closure); the closure runs forward and backward 4 times a step",
        forwards=4,  # max_iter=4: the first evaluation and one after each of 3 updates
        backwards=4,
    ),
    Loop("ddp", "DistributedDataParallel, gloo, world size 1 in-process", ("--hidden", "256")),
    Loop("dataloader_workers", "DataLoader with num_workers=2 and a Dataset class", settle=6),
    Loop("indexed_dataset", "in-memory dataset tensor indexed by the loop: x = data[idx]"),
    Loop("compiled", "torch.compile'd MLP (inductor on the CPU)"),
    Loop("lstm_lm", "LSTM language model, truncated BPTT, tied weights, grad clipping"),
    Loop("custom_function", "custom torch.autograd.Function (hand-written Swish) in each block"),
    Loop(
        "activation_tanh",
        "blocks ending in Tanh (Linear-LayerNorm-Tanh) in a Sequential",
        file="activation_blocks",
        args=("--activation", "tanh"),
    ),
    Loop(
        "activation_relu",
        "blocks ending in ReLU",
        file="activation_blocks",
        args=("--activation", "relu"),
    ),
    Loop(
        "activation_gelu",
        "blocks ending in GELU",
        file="activation_blocks",
        args=("--activation", "gelu"),
    ),
    Loop("linear_relu", "one flat nn.Sequential of alternating Linear / ReLU"),
    Loop(
        "checkpoint_sequential",
        "residual MLP; --checkpoint: checkpoint_sequential over its nn.Sequential",
        checkpoint=True,
        no_effect_checkpoint={
            "sqrt": "checkpoint_sequential calls the blocks itself: the Sequential never runs"
        },
    ),
    Loop(
        "python_loop_sequential",
        "nn.Sequential looped over in Python (for layer in self.layers)",
        checkpoint=True,
        no_effect={"sqrt": "the Sequential's own forward never runs: it is looped over"},
        no_effect_checkpoint={"sqrt": "the Sequential's own forward never runs: it is looped over"},
    ),
    Loop(
        "function_checkpoints",
        "checkpoint(fn, block, x) on plain functions; the blocks are never called",
        checkpoint=True,
        no_effect={
            "sqrt": "the blocks hold weights but are never called",
            "all": "the blocks hold weights but are never called",
        },
        no_effect_checkpoint={
            "sqrt": "the blocks hold weights but are never called",
            "all": "the blocks hold weights but are never called",
        },
    ),
    Loop(
        "heavy_model",
        "tutorial HeavyModel: 1,000 calls x 100 scalar adds per forward, no optimizer",
        ("--size", "20"),
        optimizer_steps=0,
        checkpoint=True,
        plans=("none",),
        no_effect={"sqrt": "no chain of blocks: one function called --size times"},
        no_effect_checkpoint={"sqrt": "no chain of blocks: one function called --size times"},
    ),
)
