"""What every figure of ``python -m bench figures`` shares: the machine names, the size, and
the helpers that load a result, make a figure and save it small."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

H100 = "H100 80GB, 16-core host"
H200 = "2x H200, 32-core host"
TWO_CORE = "2-core CPU machine"
SIZE = (6.0, 3.5)
DPI = 100


def _load(path: Path) -> Any:
    return json.loads(path.read_text())


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 8, "axes.titlesize": 9, "legend.fontsize": 7})
    return plt


def _save(fig, path: Path) -> Path:
    """Writes a palette PNG: the plots are a few flat colours, so this keeps each file small."""
    from PIL import Image

    plt = _plt()
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    plt.close(fig)
    buf.seek(0)
    image = Image.open(buf).convert("RGB").quantize(colors=64)
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, format="PNG", optimize=True)
    return path


def _wrap(text: str, width: int = 78) -> str:
    import textwrap

    return "\n".join(textwrap.wrap(text, width))


def _suptitle(fig, text: str) -> None:
    fig.suptitle(_wrap(text), fontsize=9)


def _title(ax, text: str) -> None:
    ax.set_title(_wrap(text, 64))


def _label_bars(ax, bars, fmt: str = "{:,.0f}") -> None:
    for bar in bars:
        h = bar.get_height()
        ax.annotate(
            fmt.format(h),
            (bar.get_x() + bar.get_width() / 2, h),
            ha="center",
            va="bottom",
            fontsize=7,
            xytext=(0, 1),
            textcoords="offset points",
        )
