"""check-gpu's clock and log lines, and its report: the tables of gpu_check.txt and the targets."""

from __future__ import annotations

import time

TARGET_SPEEDUP = 1.9  # deepseek-v3-layer, bf16 (and bf16-int4), 1 token, vs the expanded twin
TARGET_KINDS = ("bf16", "bf16-int4")
TARGET_COPY_FRACTION = 0.75


class Clock:
    """Seconds since the check started (--budget-s counts from here), and progress lines stamped with them."""

    def __init__(self) -> None:
        self.start = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def log(self, message: str) -> None:
        print(f"[{self.elapsed():7.1f}s] {message}", flush=True)


def table(results: dict) -> str:
    lines = []
    bw = results.get("bandwidth") or {}
    lines.append(
        f"device copy bandwidth {bw.get('copy_GBps', 0):.0f} GB/s (read+write), read-only {bw.get('read_GBps', 0):.0f}"
        " GB/s"
    )
    lines.append("")
    lines.append("correctness")
    for r in results["correctness"]:
        out = r.get("output") or {}
        route = r.get("routing") or {}
        lines.append(
            f"  {'PASS' if r['pass'] else 'FAIL'} {r['preset']:22s} {r['dtype']:9s} T={r['tokens']:3d} "
            + (
                f"rel.err {out.get('relative_error_vs_fp32_math', float('nan')):.1e} "
                f"routing diffs {route.get('tokens_differing_from_reference', '?')} "
                f"(non-tie {route.get('differences_not_near_ties', '?')})"
                if not r.get("error")
                else r["error"][:100]
            )
        )
    lines.append("")
    header = (
        f"  {'preset':20s} {'dt':9s} {'T':>3s} {'deamoe us':>10s} {'graph us':>9s} {'GB/s':>6s} {'%copy':>6s} "
        f"{'expand us':>10s} {'x exp':>6s} {'x exp g':>7s} {'pdl us':>8s} {'x pdl':>6s} "
        f"{'torch us':>9s} {'x torch':>7s}"
    )
    lines.append("benchmarks (medians; x exp = expanded / deamoe, eager; g = CUDA graph; pdl = programmatic launch)")
    lines.append(header)
    for b in results["benchmarks"]:
        t = {(s["variant"], s["mode"], s["pdl"]): s for s in b["timings"]}
        d = t.get(("deamoe", "eager", False), {})
        g = t.get(("deamoe", "graph", False), {})
        e = t.get(("expanded", "eager", False), {})
        p = t.get(("deamoe", "eager", True), {})
        r = t.get(("torch", "eager", False), {})
        s = b["speedups"]

        def num(value, fmt):
            width = int(fmt.split(".")[0] or 0)
            return format(value, fmt) if isinstance(value, (int, float)) else "-".rjust(width)

        lines.append(
            f"  {b['preset']:20s} {b['dtype']:9s} {b['tokens']:3d} {num(d.get('median_us'), '10.1f')} "
            f"{num(g.get('median_us'), '9.1f')} {num(d.get('bandwidth_GBps'), '6.0f')} "
            f"{num(100 * d['copy_fraction'] if d.get('copy_fraction') else None, '6.1f')} "
            f"{num(e.get('median_us'), '10.1f')} {num(s.get('vs_expanded_eager'), '6.2f')} "
            f"{num(s.get('vs_expanded_graph'), '7.2f')} {num(p.get('median_us'), '8.1f')} "
            f"{num(s.get('vs_expanded_eager_pdl'), '6.2f')} {num(r.get('median_us'), '9.1f')} "
            f"{num(s.get('vs_torch_eager'), '7.1f')}"
        )
    profiles = [(b, k) for b in results["benchmarks"] for k in b.get("profile") or [] if "kernel" in k]
    if profiles:
        lines.append("")
        lines.append("per kernel (torch.profiler; bytes and prediction from deamoe_trt.perf_model)")
        for b, k in profiles:
            predicted = f"{k['predicted_us']:8.1f}" if "predicted_us" in k else "       -"
            lines.append(
                f"  {b['preset']:20s} {b['dtype']:9s} T={b['tokens']:2d} {k['kernel']} {k['avg_us']:8.1f} us "
                f"{k['bytes'] / 1e6:8.1f} MB {k['bandwidth_GBps']:6.0f} GB/s  predicted {predicted} us"
            )
    if results.get("targets"):
        lines.append("")
        lines.append("targets (deepseek-v3-layer, 1 token; int4 against its int4 twin)")
        for name, value in results["targets"].items():
            lines.append(f"  {name}: {value}")
    if results["errors"] or results["skipped"]:
        lines.append("")
        lines += [f"  error: {e}" for e in results["errors"]] + [f"  skipped: {s}" for s in results["skipped"]]
    return "\n".join(lines)


def targets(results: dict) -> dict:
    out = {}
    for b in results["benchmarks"]:
        if b["preset"] != "deepseek-v3-layer" or b["dtype"] not in TARGET_KINDS or b["tokens"] != 1:
            continue
        t = {(s["variant"], s["mode"], s["pdl"]): s for s in b["timings"]}
        for mode in ("eager", "graph"):
            for pdl in (False, True):
                d = t.get(("deamoe", mode, pdl))
                e = t.get(("expanded", mode, pdl))
                if not d or not e:
                    continue
                key = f"{b['dtype']} {mode}{' + pdl' if pdl else ''}"
                speedup = e["median_us"] / d["median_us"]
                fraction = d.get("copy_fraction") or 0.0
                out[key] = (
                    f"speedup vs expanded {speedup:.2f} (target >= {TARGET_SPEEDUP}: "
                    f"{'met' if speedup >= TARGET_SPEEDUP else 'NOT met'}), "
                    f"{100 * fraction:.1f}% of copy bandwidth (target >= {100 * TARGET_COPY_FRACTION:.0f}%: "
                    f"{'met' if fraction >= TARGET_COPY_FRACTION else 'NOT met'})"
                )
    return out
