"""The terminal report of a benchmark result."""

from __future__ import annotations

from ..console import format_bytes, format_table

# The CPU targets for the qwen3-30b-a3b-layer preset, fp32, 1 token per step.
TARGET_SPEEDUP = 1.45
TARGET_ROOF_FRACTION = 0.70


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}"


def _x(value: float | None) -> str:
    return f"{value:.2f}x" if value is not None else ""


# The first columns of every benchmark's results table (bench and the quantized bench).
TIMING_HEADERS = ("contender", "tokens", "weights/step", "median ms", "p10 ms", "p90 ms")


def timing_cells(r: dict) -> tuple:
    """A result row's TIMING_HEADERS cells."""
    return (
        r["contender"],
        r["tokens"],
        format_bytes(r["bytes_per_step_mean"]),
        _ms(r["median_s"]),
        _ms(r["p10_s"]),
        _ms(r["p90_s"]),
    )


def results_table(section: dict, title: str) -> str:
    rows = [
        (
            *timing_cells(r),
            _ms(r["roof_s"]),
            f"{r['roof_fraction']:.0%}",
            _x(r.get("speedup_vs_expanded")),
            _x(r.get("speedup_vs_vanilla_ort")),
        )
        for r in section.get("results", [])
    ]
    headers = (*TIMING_HEADERS, "roof ms", "of roof", "vs expanded", "vs vanilla ORT")
    return format_table(headers, rows, title=title)


def contenders_table(section: dict) -> str:
    rows = []
    for c in section.get("contenders", []):
        if c["status"] == "ok":
            detail = c.get("builder", c.get("simd", ""))
            if "max_abs_diff" in c:
                detail = f"{detail} max|diff| {c['max_abs_diff']:.1e}".strip()
            if c.get("warning"):
                detail += f" WARNING: {c['warning']}"
        else:
            detail = c.get("reason", "")
        rows.append(
            (c["name"], c["status"], format_bytes(c.get("memory_bytes", 0)) if c["status"] == "ok" else "", detail)
        )
    return format_table(("contender", "status", "memory", "detail"), rows, title="Contenders", align="llrl")


def targets(section: dict) -> list[str]:
    """The CPU targets, checked where the run has the figures (1 token per step)."""
    rows = {r["contender"]: r for r in section.get("results", []) if r["tokens"] == 1}
    fast = rows.get("deamoe/cpu")
    if not fast:
        return []
    lines = []
    checks = [
        ("DeaMoE (cpu) vs its expanded twin (cpu)", fast.get("speedup_vs_expanded"), TARGET_SPEEDUP, "x"),
        ("DeaMoE (cpu) vs vanilla MoE (ONNX Runtime)", fast.get("speedup_vs_vanilla_ort"), TARGET_SPEEDUP, "x"),
        ("DeaMoE (cpu) fraction of the roof", fast.get("roof_fraction"), TARGET_ROOF_FRACTION, "%"),
    ]
    for label, value, target, unit in checks:
        if value is None:
            continue
        shown = f"{value:.2f}x" if unit == "x" else f"{value:.0%}"
        wanted = f"{target:.2f}x" if unit == "x" else f"{target:.0%}"
        lines.append(f"  {label}: {shown} (target >= {wanted}: {'met' if value >= target else 'NOT met'})")
    return lines


def format_result(result: dict) -> str:
    m, s, b = result["machine"], result["settings"], result["bandwidth"]
    out = [
        f"Machine: {m['cpu_model']}, {m['cores']} core(s), {m['threads']} thread(s); "
        f"load average {m['load_average']} at start, {m.get('load_average_end')} at end",
        f"Read bandwidth, standalone: {b['standalone_bytes_per_s'] / 1e9:.1f} GB/s "
        f"({b['kernel_before']['method']}, before and after); "
        f"numpy 1 thread: {b['numpy']['bytes_per_s'] / 1e9:.1f} GB/s",
    ]
    for name in ("layer", "stack"):
        roof = result.get(name, {}).get("roof")
        if roof:
            out.append(
                f"Roof of the {name} runs: {roof['bytes_per_s'] / 1e9:.1f} GB/s (median; p10 "
                f"{roof['p10_bytes_per_s'] / 1e9:.1f}, p90 {roof['p90_bytes_per_s'] / 1e9:.1f}) over "
                f"{len(roof['probes_bytes_per_s'])} probes of {roof['probe_bytes'] / 2**20:.0f} MiB interleaved "
                "with the contenders"
            )
    out.append("")
    layer = result["layer"]
    head = f"{layer['preset']}, {layer['dtype']}"
    if layer["status"] != "ok":
        out.append(f"Single layer ({head}): skipped: {layer['reason']}")
    else:
        out.append(contenders_table(layer))
        out.append("")
        out.append(
            results_table(
                layer,
                f"Single layer: {head}, median of {layer['steps']} steps after {layer['warmup']} warm-up, interleaved",
            )
        )
        lines = targets(layer)
        if lines and s["preset"] == "qwen3-30b-a3b-layer" and s["dtype"] == "fp32":
            out += ["", "Targets (1 token per step):", *lines]
    stack = result.get("stack", {})
    out.append("")
    if stack.get("status") == "ok":
        out.append(
            results_table(
                stack,
                f"Stack of {stack['num_layers']} layers ({stack['preset']}, {stack['dtype']}): "
                "time per decoding step of the FFN part (= time per output token)",
            )
        )
        skipped = [c for c in stack["contenders"] if c["status"] != "ok"]
        for c in skipped:
            out.append(f"  {c['name']}: skipped: {c['reason']}")
    else:
        out.append(f"Stack: skipped: {stack.get('reason', '')}")
    return "\n".join(out)
