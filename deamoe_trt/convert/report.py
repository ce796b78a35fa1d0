"""The conversion report as tables and as a PNG of quality against shared fraction."""

from __future__ import annotations

from pathlib import Path

from .._io import atomic_path
from ..console import format_bytes, format_table
from ..errors import MissingDependencyError
from .baselines import BASELINES, DELTA, DELTA_ONE, PRUNED, TOP_K

METHODS = ("source", "converted", "naive", "merged", *BASELINES)
HEALED = " + healed"
STYLES = {
    "converted + healed": ("tab:blue", "o", "-"),
    "converted": ("tab:cyan", "o", "--"),
    "naive": ("tab:red", "x", ":"),
    "merged": ("tab:orange", "s", "-."),
    PRUNED: ("tab:green", "^", "-."),
    TOP_K: ("tab:purple", "v", ":"),
    DELTA: ("tab:brown", "D", "--"),
    DELTA_ONE: ("tab:gray", "d", ":"),
}


def method_rank(method: str) -> tuple[int, int]:
    """Table order: the source, then each method healed before unhealed, in METHODS' order."""
    healed = method.endswith(HEALED)
    return METHODS.index(method.removesuffix(HEALED)), 0 if healed else 1


def _size(row: dict) -> str:
    """A baseline's own size; the conversion's f_s / f_p."""
    for key, label in (("expert_width", "f"), ("top_k", "k"), ("rank", "r")):
        if key in row:
            return f"{label}={row[key]}"
    return "-" if row["method"] == "source" else f"{row['f_s']}/{row['f_p']}"


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def report_table(report: dict, *, fraction: float | None = None, markdown: bool = False) -> str:
    """One row per variant (at one shared fraction, or all), source first."""
    rows = [
        r for r in report["rows"] if fraction is None or r["method"] == "source" or r["shared_fraction"] == fraction
    ]
    rows.sort(key=lambda r: (r["shared_fraction"], method_rank(r["method"])))
    is_lm = any("perplexity" in r for r in rows)
    split = all("routing_error" in r for r in rows)
    headers = ["method", "f_s/f", "size", "bytes/step", "vs source", "rel. error", "expert agreement"]
    headers += ["routing err.", "weights err."] if split else []
    if is_lm:
        headers += ["perplexity", "vs source", "next-token agr."]
    source = next(r for r in rows if r["method"] == "source")
    out = []
    for r in rows:
        cells = [
            r["method"],
            "-" if r["method"] == "source" else f"{r['shared_fraction']:.2f}",
            _size(r),
            format_bytes(r["bytes_per_step"]),
            f"{r['bytes_vs_source']:.1%}",
            f"{_mean(r['relative_error']):.4f}",
            f"{_mean(r['expert_agreement']):.1%}",
        ]
        if split:
            cells += [f"{_mean(r['routing_error']):.4f}", f"{_mean(r['weights_error']):.4f}"]
        if is_lm:
            cells += [
                f"{r['perplexity']:.3f}",
                f"{r['perplexity'] / source['perplexity'] - 1:+.1%}",
                f"{r['next_token_agreement']:.1%}",
            ]
        out.append(cells)
    s = report["source"]
    title = (
        f"Conversion of {s['layers']} layer(s) of {s['num_experts']} experts (width {s['expert_width']}, "
        f"top-{s['top_k']}); held-out {s['heldout_tokens']} tokens per layer; errors and agreement: mean over layers; "
        "routing err.: the source's experts on the method's choices; weights err.: the rest"
    )
    return format_table(headers, out, title=title, markdown=markdown)


def write_plot(report: dict, path: str | Path) -> Path:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MissingDependencyError("--plot needs matplotlib (pip install matplotlib)") from None
    rows = report["rows"]
    is_lm = any("perplexity" in r for r in rows)
    source = next(r for r in rows if r["method"] == "source")
    panels = [("relative output error (mean over layers)", lambda r: _mean(r["relative_error"]))]
    if is_lm:
        panels.append(("held-out perplexity / source's", lambda r: r["perplexity"] / source["perplexity"]))
        panels.append(("greedy next-token agreement", lambda r: r["next_token_agreement"]))
    panels.append(("bytes per step / source's", lambda r: r["bytes_vs_source"]))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.4 * len(panels), 3.8), squeeze=False)
    for ax, (title, value) in zip(axes[0], panels, strict=True):
        for method in sorted({r["method"] for r in rows} - {"source"}, key=method_rank):
            if method in STYLES:
                color, marker, style = STYLES[method]
            else:  # a healed baseline: its unhealed colour and marker, solid
                color, marker, _ = STYLES.get(method.removesuffix(HEALED), ("black", ".", ""))
                style = "-"
            points = sorted((r["shared_fraction"], value(r)) for r in rows if r["method"] == method)
            if points:
                xs, ys = zip(*points, strict=True)
                ax.plot(xs, ys, color=color, marker=marker, linestyle=style, label=method)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("shared fraction f_s / f")
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
    return path


def recorded_table(conversion: dict) -> str:
    """The source and converted rows a converted checkpoint records (training.conversion)."""
    rows = conversion["report"]
    fraction = next(r["shared_fraction"] for r in rows if r["method"] != "source")
    source = {"layers": len(rows[0]["relative_error"]), "num_experts": "?", "expert_width": "?", "top_k": "?"}
    source.update(conversion.get("source", {}))
    return report_table({"rows": rows, "source": source}, fraction=fraction)


def lm_step_bytes(model, ids: list[int]) -> dict[str, float]:
    """Bytes per one-token decoding step of a language model ("deamoe") and of its vanilla
    twin (shared neurons copied into every expert, one-stage top-k: the source's shape),
    routing the tokens ids through each; all blocks together."""
    import torch

    from ..traffic import BYTES_PER_WEIGHT
    from .metrics import step_bytes

    measured = {}
    for name in ("deamoe", "vanilla"):
        twin = model.twin(name)
        with torch.no_grad():
            routings = twin(torch.tensor([ids])).routings
        measured[name] = sum(step_bytes(twin.config.moe, r, BYTES_PER_WEIGHT[twin.dtype]) for r in routings)
    return measured


def lm_bytes_table(model, ids: list[int]) -> str:
    measured = lm_step_bytes(model, ids)
    rows = [(name, format_bytes(b), f"{b / measured['vanilla']:.1%}") for name, b in measured.items()]
    return format_table(("model", "FFN weights/step", "vs vanilla"), rows, title=f"Measured on {len(ids)} tokens")
