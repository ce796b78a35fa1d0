"""The conversion report as tables and as a PNG of quality against shared fraction."""

from __future__ import annotations

from pathlib import Path

from .._io import atomic_path
from ..console import format_bytes, format_table
from ..errors import MissingDependencyError, UsageError
from .baselines import BASELINES, DELTA, DELTA_ONE, PRUNED, PRUNED_CONVERTED, TOP_K
from .metrics import STEP_TOKENS

METHODS = ("source", "converted", "naive", "merged", *BASELINES)
HEALED = " + healed"
STYLES = {
    "converted + healed": ("tab:blue", "o", "-"),
    "converted": ("tab:cyan", "o", "--"),
    "naive": ("tab:red", "x", ":"),
    "merged": ("tab:orange", "s", "-."),
    PRUNED: ("tab:green", "^", "-."),
    PRUNED_CONVERTED: ("tab:olive", "P", "-."),
    TOP_K: ("tab:purple", "v", ":"),
    DELTA: ("tab:brown", "D", "--"),
    DELTA_ONE: ("tab:gray", "d", ":"),
}


def method_rank(method: str) -> tuple[int, int]:
    """Table order: the source, then each method healed before unhealed, in METHODS' order."""
    healed = method.endswith(HEALED)
    return METHODS.index(method.removesuffix(HEALED)), 0 if healed else 1


def _size(row: dict) -> str:
    """A baseline's own size; the conversion's f_s / f_p (after pruning to f, for the composition)."""
    if "pruned_width" in row:
        return f"f={row['pruned_width']}: {row['f_s']}/{row['f_p']}"
    for key, label in (("expert_width", "f"), ("top_k", "k"), ("rank", "r")):
        if key in row:
            return f"{label}={row[key]}"
    return "-" if row["method"] == "source" else f"{row['f_s']}/{row['f_p']}"


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def step_bytes_of(row: dict, tokens: int = 1) -> tuple[float, float]:
    """(bytes per step, the same / the source's) of a report row at `tokens` tokens per step
    (rows written before the per-token counts hold the one-token figures only)."""
    if "bytes_per_step_at" in row:
        return row["bytes_per_step_at"][str(tokens)], row["bytes_vs_source_at"][str(tokens)]
    if tokens != 1:
        raise UsageError(f"this report counts bytes at one token per step only, not {tokens}; convert again")
    return row["bytes_per_step"], row["bytes_vs_source"]


def quality(row: dict) -> float:
    """What the frontier ranks a row by, lower is better: held-out perplexity for language
    models, else the mean relative output error."""
    return row["perplexity"] if "perplexity" in row else _mean(row["relative_error"])


def frontier(rows: list[dict], tokens: int = 1) -> set[int]:
    """Indices of the rows on the bytes-quality frontier at `tokens` tokens per step: those
    no other row beats on both (no larger in bytes and no worse in quality, better in one)."""
    points = [(step_bytes_of(r, tokens)[0], quality(r)) for r in rows]
    return {
        i for i, (b, q) in enumerate(points) if not any(ob <= b and oq <= q and (ob < b or oq < q) for ob, oq in points)
    }


def report_table(report: dict, *, fraction: float | None = None, markdown: bool = False, tokens: int = 1) -> str:
    """One row per variant (at one shared fraction, or all), source first; bytes at `tokens`
    tokens per step, and which rows are on the bytes-quality frontier there."""
    rows = [
        r for r in report["rows"] if fraction is None or r["method"] == "source" or r["shared_fraction"] == fraction
    ]
    rows.sort(key=lambda r: (r["shared_fraction"], method_rank(r["method"])))
    is_lm = any("perplexity" in r for r in rows)
    split = all("routing_error" in r for r in rows)
    kept = all("weight_kept" in r for r in rows)
    headers = ["method", "f_s/f", "size", "bytes/step", "vs source", "rel. error", "expert agreement"]
    headers += ["weight kept"] if kept else []
    headers += ["routing err.", "weights err."] if split else []
    if is_lm:
        headers += ["perplexity", "vs source", "next-token agr."]
    headers.append("frontier")
    source = next(r for r in rows if r["method"] == "source")
    best = frontier(rows, tokens)
    out = []
    for i, r in enumerate(rows):
        per_step, vs_source = step_bytes_of(r, tokens)
        cells = [
            r["method"],
            "-" if r["method"] == "source" else f"{r['shared_fraction']:.2f}",
            _size(r),
            format_bytes(per_step),
            f"{vs_source:.1%}",
            f"{_mean(r['relative_error']):.4f}",
            f"{_mean(r['expert_agreement']):.1%}",
        ]
        if kept:
            cells.append(f"{_mean(r['weight_kept']):.1%}")
        if split:
            cells += [f"{_mean(r['routing_error']):.4f}", f"{_mean(r['weights_error']):.4f}"]
        if is_lm:
            cells += [
                f"{r['perplexity']:.3f}",
                f"{r['perplexity'] / source['perplexity'] - 1:+.1%}",
                f"{r['next_token_agreement']:.1%}",
            ]
        cells.append("yes" if i in best else "")
        out.append(cells)
    s = report["source"]
    title = (
        f"Conversion of {s['layers']} layer(s) of {s['num_experts']} experts (width {s['expert_width']}, "
        f"top-{s['top_k']}); held-out {s['heldout_tokens']} tokens per layer; bytes per step at {tokens} token(s) "
        "per step; errors and agreement: mean over layers; "
        + ("weight kept: the share of the source's routing weight on experts the method also picks; " if kept else "")
        + "routing err.: the source's experts on the method's choices; weights err.: the rest; "
        "frontier: no other row is both smaller and better there"
    )
    return format_table(headers, out, title=title, markdown=markdown)


def write_plot(report: dict, path: str | Path) -> Path:
    plt = _pyplot()
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
    return _save(plt, fig, path)


def write_frontier_plot(report: dict, path: str | Path, tokens: tuple[int, ...] = STEP_TOKENS) -> Path:
    """Quality against bytes per step, one panel per tokens-per-step count, every method's
    points and the frontier through them."""
    plt = _pyplot()
    rows = report["rows"]
    is_lm = any("perplexity" in r for r in rows)
    source = next(r for r in rows if r["method"] == "source")
    label = "held-out perplexity / source's" if is_lm else "relative output error (mean over layers)"
    scale = quality(source) if is_lm else 1.0
    fig, axes = plt.subplots(1, len(tokens), figsize=(4.6 * len(tokens), 4.0), squeeze=False)
    for ax, t in zip(axes[0], tokens, strict=True):
        for method in sorted({r["method"] for r in rows}, key=method_rank):
            color, marker, _ = STYLES.get(method.removesuffix(HEALED), ("black", "*", ""))
            points = [(step_bytes_of(r, t)[1], quality(r) / scale) for r in rows if r["method"] == method]
            xs, ys = zip(*points, strict=True)
            filled = "full" if method == "source" or method.endswith(HEALED) or method not in STYLES else "none"
            ax.plot(xs, ys, linestyle="", color=color, marker=marker, fillstyle=filled, label=method)
        edge = sorted((step_bytes_of(rows[i], t)[1], quality(rows[i]) / scale) for i in frontier(rows, t))
        ax.step(*zip(*edge, strict=True), where="post", color="black", alpha=0.4, label="frontier")
        ax.set_title(f"{t} token(s) per step", fontsize=10)
        ax.set_xlabel("bytes per step / source's")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=7)
    return _save(plt, fig, path)


def _save(plt, fig, path: str | Path) -> Path:
    fig.tight_layout()
    path = Path(path)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
    return path


def frontier_plot_path(plot: str | Path) -> Path:
    """Where `convert --plot R.png` writes the frontier plot: R-frontier.png beside it."""
    plot = Path(plot)
    return plot.with_name(f"{plot.stem}-frontier{plot.suffix or '.png'}")


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MissingDependencyError("plots need matplotlib (pip install matplotlib)") from None
    return plt


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
