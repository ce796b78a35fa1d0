"""The benchmark's figure: time per step against tokens per step, with the roofs."""

from __future__ import annotations

from pathlib import Path

from .._io import atomic_path
from ..errors import MissingDependencyError

COLORS = {"deamoe": "tab:blue", "expanded": "tab:orange", "vanilla": "tab:red"}
MARKERS = {"cpu": "o", "ort": "s", "torch": "^"}
LINESTYLES = {"cpu": "-", "ort": "-.", "torch": ":"}
# The expanded twin and the vanilla MoE read nearly the same bytes: keep both lines visible.
BYTES_MARKERS = {"deamoe": "o", "expanded": "s", "vanilla": "x"}
BYTES_LINESTYLES = {"deamoe": "-", "expanded": "-", "vanilla": "--"}


def pyplot():
    """matplotlib.pyplot on the file-only Agg backend, or MissingDependencyError saying how to get it."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MissingDependencyError("--plot needs matplotlib (pip install matplotlib)") from None
    return plt


def write_plot(result: dict, path: str | Path) -> Path:
    plt = pyplot()

    panels = [("layer", "time")]
    layer = result["layer"]
    if layer.get("results"):
        panels.append(("layer", "bytes"))
    stack = result.get("stack", {})
    if stack.get("results"):
        panels.append(("stack", "time"))
    fig, axes = plt.subplots(1, len(panels), figsize=(6.2 * len(panels), 4.8), squeeze=False)
    for ax, (section_name, what) in zip(axes[0], panels, strict=True):
        section = result[section_name]
        if what == "time":
            _time_panel(ax, section, section_name)
        else:
            _bytes_panel(ax, section)
    m = result["machine"]
    roof = layer.get("roof") or stack.get("roof")
    rate = (
        f", single-layer roof {roof['bytes_per_s'] / 1e9:.1f} GB/s (read bandwidth measured during the run)"
        if roof
        else ""
    )
    fig.suptitle(f"deamoe-trt bench: {m['cpu_model']}, {m['threads']} threads{rate}", fontsize=10)
    fig.tight_layout()
    path = Path(path)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
    return path


def _series(section: dict):
    by_name: dict[str, list[dict]] = {}
    for row in section.get("results", []):
        by_name.setdefault(row["contender"], []).append(row)
    for rows in by_name.values():
        rows.sort(key=lambda r: r["tokens"])
    return by_name


def _time_panel(ax, section: dict, section_name: str) -> None:
    if section.get("status") != "ok" or not section.get("results"):
        ax.text(0.5, 0.5, f"skipped:\n{section.get('reason', '')[:120]}", ha="center", va="center", wrap=True)
        ax.set_axis_off()
        return
    series = _series(section)
    roofs: dict[str, list[tuple[int, float]]] = {}
    for name, rows in series.items():
        model, runtime = rows[0]["model"], rows[0]["runtime"]
        tokens = [r["tokens"] for r in rows]
        ax.errorbar(
            tokens,
            [r["median_s"] * 1e3 for r in rows],
            yerr=[
                [(r["median_s"] - r["p10_s"]) * 1e3 for r in rows],
                [(r["p90_s"] - r["median_s"]) * 1e3 for r in rows],
            ],
            color=COLORS[model],
            marker=MARKERS[runtime],
            linestyle=LINESTYLES[runtime],
            capsize=3,
            label=name,
        )
        roofs.setdefault(model, [(r["tokens"], r["roof_s"] * 1e3) for r in rows])
    for model, points in roofs.items():
        ax.plot(
            [t for t, _ in points],
            [v for _, v in points],
            color=COLORS[model],
            linestyle="--",
            linewidth=1,
            label=f"{model} roof",
        )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("tokens per decoding step")
    ax.set_ylabel("time per step (ms), median, p10-p90")
    if section_name == "stack":
        ax.set_title(f"{section['num_layers']}-layer stack ({section['preset']}, {section['dtype']})", fontsize=10)
    else:
        ax.set_title(f"one layer: {section['preset']} ({section['dtype']})", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)


def _bytes_panel(ax, section: dict) -> None:
    series = _series(section)
    seen = set()
    for rows in series.values():
        model = rows[0]["model"]
        if model in seen:
            continue
        seen.add(model)
        ax.plot(
            [r["tokens"] for r in rows],
            [r["bytes_per_step_mean"] / 1e6 for r in rows],
            color=COLORS[model],
            marker=BYTES_MARKERS[model],
            linestyle=BYTES_LINESTYLES[model],
            label=model,
        )
    ax.set_xscale("log", base=2)
    ax.set_xlabel("tokens per decoding step")
    ax.set_ylabel("weights loaded per step (MB), mean")
    ax.set_title("bytes per step (deamoe_trt.traffic)", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
