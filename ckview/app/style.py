"""Colours and themes shared by the explorer and the exported report (Qt-free: hex strings).

Category colours are a colour-blind-safe qualitative palette (Okabe-Ito), the same in both
themes; a theme sets only the background, text, grid and band tints.
"""

from __future__ import annotations

from dataclasses import dataclass

from ckview.trace.schema import Category, Phase

CATEGORY_COLORS: dict[Category, str] = {
    Category.PARAMETER: "#0072B2",  # blue
    Category.GRADIENT: "#56B4E9",  # sky
    Category.OPTIMIZER_STATE: "#009E73",  # green
    Category.INPUT: "#999999",  # grey
    Category.ACTIVATION: "#E69F00",  # orange
    Category.TEMPORARY: "#F0E442",  # yellow
    Category.OTHER: "#CC79A7",  # purple
    # FSDP: shades of the parameter blue; buffers in transit brown
    Category.SHARDED_PARAMETER: "#004A75",  # dark blue
    Category.UNSHARDED_PARAMETER: "#80B9D9",  # pale blue
    Category.COMM_BUFFER: "#8C564B",  # brown
    Category.UNKNOWN: "#5F5F5F",  # dark grey: what a snapshot cannot say
}

RUN_COLORS: tuple[str, ...] = (
    "#1f77b4",
    "#d62728",
    "#2ca02c",
    "#9467bd",
    "#ff7f0e",
    "#17becf",
    "#8c564b",
    "#e377c2",
)
"""Line colours of runs compared on one plot, in order."""

PROJECTION_COLOR = "#D55E00"
"""The projected curve of the plan being built (vermillion, dashed)."""

# NOTE [ Projected curve halo ]
# The projected curve is drawn over the stacked fills, one of which (activations) is orange
# like the curve itself. A solid line in the theme's background colour, wider than the dashed
# curve, is drawn under it: the dashes then read on every fill and band, in both themes, and
# the curve keeps the projection's colour everywhere else in the app (strip, readout, legend).
PROJECTION_PEN_WIDTH = 2.6
PROJECTION_HALO_WIDTH = 6.0

PEAK_COLOR = "#D00000"


@dataclass(frozen=True)
class Theme:
    name: str
    background: str
    foreground: str
    grid_alpha: float
    phase_tints: dict[Phase, str]
    """Band colour per phase, with alpha (#RRGGBBAA)."""
    recompute_tint: str
    overview_region: str
    peak_text: str
    """``PEAK_COLOR`` made readable as text on this background (and on its phase bands)."""
    projection_text: str
    """``PROJECTION_COLOR`` made readable as text on this background."""
    label_fill: str
    """Box behind a value label on a plot (#RRGGBBAA): it reads on any fill or band."""
    host_color: str
    """The host curve of an offload plan (NOTE [ Host curve ] in ckview.analysis.projection):
    a purple no category uses, drawn with the projection's halo; lighter on a dark
    background."""


LIGHT = Theme(
    name="light",
    background="#FFFFFF",
    foreground="#202020",
    grid_alpha=0.25,
    phase_tints={
        Phase.FORWARD: "#4C9BE81C",
        Phase.BACKWARD: "#E84C4C18",
        Phase.RECOMPUTE: "#D55E0040",
        Phase.OPTIMIZER: "#2CA02C1C",
    },
    recompute_tint="#D55E0050",
    overview_region="#1F77B440",
    peak_text="#B00000",
    projection_text="#A84300",
    label_fill="#FFFFFFE6",
    host_color="#6A3D9A",
)

DARK = Theme(
    name="dark",
    background="#1E1F22",
    foreground="#E6E6E6",
    grid_alpha=0.2,
    phase_tints={
        Phase.FORWARD: "#4C9BE830",
        Phase.BACKWARD: "#E84C4C2C",
        Phase.RECOMPUTE: "#FF8C4060",
        Phase.OPTIMIZER: "#2CA02C30",
    },
    recompute_tint="#FF8C4070",
    overview_region="#6FB1FF50",
    peak_text="#FF7070",
    projection_text="#FF9A52",
    label_fill="#1E1F22E6",
    host_color="#B98CFF",
)

THEMES = {t.name: t for t in (LIGHT, DARK)}
