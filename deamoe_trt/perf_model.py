"""A static performance model of the CUDA forward (native/cuda/KERNELS.md, "Performance model").

    python -m deamoe_trt.perf_model [--markdown] [--ptxas-log build/kernels/build_kernels.log]

Predicts each kernel's time for one decoding step from the bytes it must stream, its grid,
the registers ptxas gave it (hence the warps an SM holds and the loads they keep in
flight), the device's memory bandwidth and latency, and the gaps between launches. It
exists so that the first device run is read against a prediction: every input below is
a datasheet figure or an assumption named as such, and nothing here was measured on a
GPU. The bytes are the kernels' own account, per kernel; their sum is the spec's weights
loaded per step (deamoe_trt.traffic), which the tests check.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from .config import DeaMoEConfig
from .console import format_table
from .errors import UsageError
from .layer import check_quantizable
from .presets import PRESETS
from .quant import QuantConfig
from .traffic import ffn_bytes

# The kernels' launch geometry (native/cuda/deamoeInternal.h).
THREADS = 128
WARPS = THREADS // 32
DOWN_ROWS_PER_BLOCK = 8
TOKENS_PER_ROUTING_BLOCK = 4
MAX_TILE_TOKENS = 16


@dataclass(frozen=True)
class Device:
    name: str
    arch: int  # sm_XY as XY
    sms: int
    bandwidth: float  # datasheet HBM/DRAM bytes/s
    stream_efficiency: float  # assumed: fraction of the datasheet a pure streaming read reaches
    latency_s: float  # assumed: DRAM load latency under load
    fma_per_s: float  # datasheet fp32 FMA/s (half the FLOP/s)
    max_warps_per_sm: int
    max_blocks_per_sm: int
    registers_per_sm: int = 65536
    smem_per_sm: int = 100 * 1024

    @property
    def pdl(self) -> bool:
        return self.arch >= 90


DEVICES = {
    "a40": Device("A40", 86, 84, 696e9, 0.88, 0.65e-6, 18.7e12, 48, 16),
    "orin": Device("Jetson AGX Orin 64GB", 87, 16, 204.8e9, 0.75, 0.75e-6, 2.65e12, 48, 16, smem_per_sm=164 * 1024),
    "h100": Device("H100 SXM", 90, 132, 3.35e12, 0.90, 0.80e-6, 33.5e12, 64, 32, smem_per_sm=228 * 1024),
    "h200": Device("H200 SXM", 90, 132, 4.8e12, 0.90, 0.85e-6, 33.5e12, 64, 32, smem_per_sm=228 * 1024),
}

# Assumed gap a dependent kernel adds before its first load (launch, drain of the
# previous grid, block dispatch), by launch mode. Programmatic launch needs sm_90.
GAP_S = {"eager": 3.0e-6, "graph": 2.0e-6, "pdl": 0.8e-6}
# Assumed latency of routing one token with one warp and building the plan (K2's routing
# blocks), per (top_k + top_departments) selection round, plus a fixed part.
ROUTING_FIXED_S = 2.0e-6
ROUTING_PER_ROUND_S = 0.3e-6

# Registers per arch, kernel and token tile: ptxas's report for bf16 (nvcc 13.0, this
# source, native/cuda/build_kernels.sh); --ptxas-log reads them from another build's log.
DEFAULT_REGISTERS = {
    86: {
        "routerSharedKernel": {1: 78, 2: 72, 4: 94, 8: 104, 16: 120},
        "routedKernel": {1: 70, 2: 80, 4: 92, 8: 96, 16: 166},
        "downKernel": {1: 72, 2: 72, 4: 96, 8: 92, 16: 112},
    },
    87: {
        "routerSharedKernel": {1: 78, 2: 72, 4: 94, 8: 104, 16: 120},
        "routedKernel": {1: 70, 2: 80, 4: 92, 8: 96, 16: 166},
        "downKernel": {1: 72, 2: 72, 4: 96, 8: 92, 16: 112},
    },
    90: {
        "routerSharedKernel": {1: 72, 2: 72, 4: 95, 8: 102, 16: 120},
        "routedKernel": {1: 68, 2: 80, 4: 92, 8: 96, 16: 166},
        "downKernel": {1: 72, 2: 78, 4: 95, 8: 92, 16: 114},
    },
}
# The same for the quantized kernels (BITS 4 and 8: int4/int8 codes, bf16 scales), sm_90;
# the model uses them for every arch (ptxas gives sm_86/87 within a few registers of it).
QUANT_REGISTERS = {
    4: {
        "routerSharedKernel": {1: 68, 2: 128, 4: 104, 8: 108, 16: 158},
        "routedKernel": {1: 70, 2: 130, 4: 141, 8: 128, 16: 176},
        "downKernel": {1: 72, 2: 92, 4: 126, 8: 110, 16: 134},
    },
    8: {
        "routerSharedKernel": {1: 68, 2: 96, 4: 108, 8: 128, 16: 128},
        "routedKernel": {1: 70, 2: 92, 4: 106, 8: 128, 16: 178},
        "downKernel": {1: 72, 2: 80, 4: 102, 8: 112, 16: 138},
    },
}
KERNELS = ("routerSharedKernel", "routedKernel", "downKernel")
# 16-byte loads each lane keeps in flight (Unroll<TT> x rows per warp, deamoeDevice.cuh).
LOADS_IN_FLIGHT = {1: 8, 2: 8, 4: 8, 8: 4, 16: 4}
# Quantized rows, gate/up and down, keep 2 chunks per row in flight (kQuantUnroll), 2 rows per warp.
QUANT_LOADS_IN_FLIGHT = 4
# Assumed instructions per quantized weight to turn a code into the float q - zp, whatever
# the tokens (deamoeDevice.cuh's dequantizeCodes: int4 a shift and a mask-or for 7 of 8
# codes and a float add; int8 a byte extract and a float add), and the extra FMA per 8
# weights and token that applies the scale. They share the SM's issue slots with the FMAs,
# which is how the model counts them (fp32 lanes = issue slots per clock on sm_80+).
DEQUANT_OPS_PER_WEIGHT = {4: 2.9, 8: 2.0}
SCALE_FMAS_PER_WEIGHT = 1 / 8


# What every row rests on, printed under the plain table.
RESTS_ON = (
    "Rests on: datasheet bandwidth and fp32 rates; the assumed streaming efficiency, load latency, launch gaps, "
    "routing time and dequantization instructions per weight of deamoe_trt/perf_model.py; the registers of "
    "{registers}; the default kernel variant. Not calibrated on a GPU: the H200 run's measured over predicted "
    'times are in native/cuda/KERNELS.md, "What the A40 and Orin rows rest on".'
)


def tile_tokens(tokens: int) -> int:
    """The kernels' token capacity for a tile of `tokens` (the next power of two, <= 16)."""
    return min(MAX_TILE_TOKENS, 1 << max(0, math.ceil(math.log2(max(tokens, 1)))))


def _variant_kernel(match: re.Match) -> bool:
    """Whether a kernel's trailing template argument makes it a variant's: downKernel<...,
    STAGED = true>, or routedKernel<..., GATE_UP_UNROLL> other than the default's chunks per row."""
    kind, value = match.group(4), match.group(5)
    if kind == "b":
        return value == "1"
    return kind == "i" and int(value) != LOADS_IN_FLIGHT[int(match.group(2))] // 2


def parse_ptxas_registers(
    text: str, arch: int, dtype: str = "__nv_bfloat16", bits: int = 0
) -> dict[str, dict[int, int]]:
    """Registers per (kernel, token tile) for one arch, dtype and weight format (bits: 0 for
    float FFN weights, 4 or 8 for the quantized kernels) from `nvcc -Xptxas -v` output: the
    default variant's kernels (KERNELS.md, "Variants"): a staged down kernel (a trailing
    `true` argument) and a routed kernel with more gate/up loads in flight are left out."""
    out: dict[str, dict[int, int]] = {}
    current = None
    for line in text.splitlines():
        entry = re.search(r"Compiling entry function '(\S+)' for 'sm_(\d+)'", line)
        if entry:
            name, sm = entry.groups()
            current = None
            match = re.search(
                r"detail\d+(\w+?Kernel)I\d*" + re.escape(dtype) + r"Li(\d+)E(?:Li(\d+)E)?(?:L([ib])(\d+)E)?", name
            )
            if match and not _variant_kernel(match) and int(sm) == arch and int(match.group(3) or 0) == bits:
                kernel = re.sub(r"^\d+", "", match.group(1))
                current = (kernel, int(match.group(2)))
            continue
        used = re.search(r"Used (\d+) registers", line)
        if used and current:
            out.setdefault(current[0], {})[current[1]] = int(used.group(1))
            current = None
    return out


@dataclass
class KernelPrediction:
    name: str
    weight_bytes: int
    blocks: int
    registers: int
    seconds: float
    bound: str  # what sets the time: bandwidth, latency (loads in flight), compute, routing


def blocks_per_sm(device: Device, registers: int, smem: int = 0) -> int:
    """Blocks of THREADS threads an SM holds, by registers (allocated per warp in units of
    256), shared memory and the SM's block and warp limits."""
    per_warp = math.ceil(registers * 32 / 256) * 256
    by_regs = device.registers_per_sm // (per_warp * WARPS)
    by_smem = device.smem_per_sm // smem if smem else device.max_blocks_per_sm
    return max(1, min(device.max_blocks_per_sm, device.max_warps_per_sm // WARPS, by_regs, by_smem))


def _stream_time(device: Device, nbytes: float, blocks: int, per_sm: int, loads: int, fmas: float) -> tuple[float, str]:
    """Seconds for `blocks` equal blocks (per_sm resident per SM) to stream nbytes, each lane
    keeping `loads` 16-byte loads in flight. Full waves share the bandwidth; a last partial
    wave runs at what its blocks alone keep in flight (Little's law: bytes in flight over
    latency), which is the tail a grid just over one wave pays."""
    if nbytes <= 0 or blocks <= 0:
        return 0.0, "none"
    roof = device.bandwidth * device.stream_efficiency
    per_block_rate = WARPS * 32 * loads * 16 / device.latency_s
    resident = per_sm * device.sms
    block_bytes = nbytes / blocks
    full_waves, partial = divmod(blocks, resident)
    full_rate = min(roof, resident * per_block_rate)
    t = full_waves * resident * block_bytes / full_rate
    bound = "bandwidth" if full_rate == roof else "latency"
    if partial:
        partial_rate = min(roof, partial * per_block_rate)
        t += partial * block_bytes / partial_rate
        if partial_rate < roof and (not full_waves or full_rate < roof):
            bound = "latency"
        elif partial_rate < roof:
            bound = "bandwidth + tail"
    t += device.latency_s  # the first loads' latency
    compute = fmas / device.fma_per_s
    if compute > t:
        return compute, "compute"
    return t, bound


def predict_step(
    config: DeaMoEConfig,
    device: Device,
    tokens: int,
    bytes_per_weight: int,
    used_departments: int,
    used_experts: int,
    mode: str = "pdl",
    registers: dict[int, dict[str, dict[int, int]]] | None = None,
    quant: QuantConfig | None = None,
) -> list[KernelPrediction]:
    """One tile of `tokens` (<= 16) tokens whose routing uses the given parts: K1, K2, K3.

    quant: the FFN weights are int4/int8 codes plus one B-byte scale per group (the router
    stays B bytes): bytes per weight, gate/up geometry, down loads in flight, registers and
    the dequantization's instructions follow the quantized kernels."""
    c, b, d, T = config, bytes_per_weight, config.hidden_size, tokens
    tt = tile_tokens(T)
    if registers:  # a build's own report (--ptxas-log), for the weight format asked for
        regs = registers[device.arch]
    else:
        regs = QUANT_REGISTERS[quant.bits] if quant else DEFAULT_REGISTERS[device.arch]
    loads = QUANT_LOADS_IN_FLIGHT if quant else LOADS_IN_FLIGHT[tt]

    def ffn(numel: int) -> int:  # bytes of numel FFN weights as stored
        return ffn_bytes(numel, b, quant)

    def ops(numel: int, tokens: float) -> float:  # issue slots (FMAs) to apply numel weights to tokens
        if quant is None:
            return tokens * numel
        return tokens * numel * (1 + SCALE_FMAS_PER_WEIGHT) + numel * DEQUANT_OPS_PER_WEIGHT[quant.bits]

    u_d = used_departments if c.shared_intermediate_size else 0
    u_e = used_experts if c.private_intermediate_size else 0
    f_s, f_p, f_sh = c.shared_intermediate_size, c.private_intermediate_size, c.shared_expert_intermediate_size
    N = c.num_experts
    gap = GAP_S["pdl" if mode == "pdl" and device.pdl else ("graph" if mode != "eager" else "eager")]

    # Gate/up geometry (Geometry<T>): a row is split over up to 4 warps of <= 256 chunks each.
    def gate_up_neurons_per_block(chunks: int) -> int:
        slices = 1
        while slices < WARPS and chunks > 256 * slices:
            slices *= 2
        return WARPS // slices

    # K1's slices follow the router rows (B bytes), K2's the FFN rows (codes when quantized).
    k1_neurons = gate_up_neurons_per_block(d * b // 16)
    neurons_per_block = gate_up_neurons_per_block(d * quant.bits // 128 if quant else d * b // 16)
    row_tiles = math.ceil(d / DOWN_ROWS_PER_BLOCK)

    # K1: router rows (+ the shared-expert gate row) and the shared experts' gate/up.
    router_rows = N + (1 if c.shared_expert_gate else 0)
    k1_bytes = router_rows * d * b + ffn(2 * f_sh * d)
    k1_blocks = math.ceil(math.ceil(router_rows / 2) / k1_neurons) + math.ceil(f_sh / k1_neurons)
    k1_regs = regs["routerSharedKernel"][tt]
    k1_time, k1_bound = _stream_time(
        device, k1_bytes, k1_blocks, blocks_per_sm(device, k1_regs), loads, T * router_rows * d + ops(2 * f_sh * d, T)
    )

    # K2: routing (the bias), the shared experts' down and the used parts' gate/up.
    routing_blocks = math.ceil(T / TOKENS_PER_ROUTING_BLOCK)
    shared_down = ffn(f_sh * d)
    routed_gate_up = ffn((u_d * 2 * f_s + u_e * 2 * f_p) * d)
    # The selection bias is float32 whatever the layer dtype (spec, "Router precision").
    k2_bytes = (N * 4 if c.router_bias else 0) + shared_down + routed_gate_up
    k2_regs = regs["routedKernel"][tt]
    smem = 4 * (N + c.num_departments) + 4 * WARPS * (N + c.num_departments + c.top_departments)
    per_sm = blocks_per_sm(device, k2_regs, smem)
    routing = ROUTING_FIXED_S + ROUTING_PER_ROUND_S * (c.top_k + c.top_departments)
    shared_t, _ = _stream_time(device, shared_down, row_tiles if f_sh else 0, per_sm, loads, ops(f_sh * d, T))
    # Expected tokens per routed part: each part's rows are applied to the tokens using it.
    slots = T * c.top_k * f_p + T * min(c.top_k, c.top_departments) * f_s  # (token, part) pairs x width
    used_width = u_e * f_p + u_d * f_s
    routed_fmas = ops(2 * used_width * d, slots / used_width if used_width else 0)
    routed_blocks = u_d * math.ceil(f_s / neurons_per_block) + u_e * math.ceil(f_p / neurons_per_block)
    routed_t, k2_bound = _stream_time(device, routed_gate_up, routed_blocks, per_sm, loads, routed_fmas)
    k2_blocks = routing_blocks + (row_tiles if f_sh else 0) + routed_blocks
    if routing > shared_t:
        k2_bound = "routing + " + k2_bound
    k2_time = max(routing, shared_t) + routed_t

    # K3: every used part's down rows, by output row tile.
    k3_bytes = ffn((u_d * f_s + u_e * f_p) * d)
    k3_regs = regs["downKernel"][tt]
    k3_time, k3_bound = _stream_time(
        device, k3_bytes, row_tiles, blocks_per_sm(device, k3_regs), loads, routed_fmas / 2
    )
    return [
        KernelPrediction("K1 router + shared gate/up", k1_bytes, k1_blocks, k1_regs, gap + k1_time, k1_bound),
        KernelPrediction(
            "K2 routing + shared down + routed gate/up", k2_bytes, k2_blocks, k2_regs, gap + k2_time, k2_bound
        ),
        KernelPrediction("K3 routed down", k3_bytes, row_tiles, k3_regs, gap + k3_time, k3_bound),
    ]


def expected_usage(config: DeaMoEConfig, tokens: int) -> tuple[float, float]:
    """Expected used departments and experts for `tokens` independently routed tokens,
    each choosing min(g, k) departments and k experts uniformly (an approximation of
    random routing: real routers are not uniform)."""
    c = config
    per_token_departments = min(c.top_departments, c.top_k)
    u_d = c.num_departments * (1 - (1 - per_token_departments / c.num_departments) ** tokens)
    u_e = c.num_experts * (1 - (1 - c.top_k / c.num_experts) ** tokens)
    return u_d, u_e


def predicted_rows(
    presets: list[str], devices: list[str], tokens: list[int], registers=None, quant: QuantConfig | None = None
) -> list[dict]:
    rows = []
    for preset in presets:
        config = PRESETS[preset]
        for key in devices:
            device = DEVICES[key]
            for T in tokens:
                u_d, u_e = expected_usage(config, T)
                ours = predict_step(config, device, T, 2, round(u_d), round(u_e), registers=registers, quant=quant)
                twin = predict_step(config.expanded(), device, T, 2, 0, round(u_e), registers=registers, quant=quant)
                t_ours = sum(k.seconds for k in ours)
                t_twin = sum(k.seconds for k in twin)
                weight_bytes = sum(k.weight_bytes for k in ours)
                rows.append(
                    {
                        "preset": preset,
                        "device": device.name,
                        "tokens": T,
                        "kernels": ours,
                        "us": 1e6 * t_ours,
                        "twin_us": 1e6 * t_twin,
                        "bytes": weight_bytes,
                        "twin_bytes": sum(k.weight_bytes for k in twin),
                        "speedup": t_twin / t_ours,
                        "hbm_fraction": weight_bytes / t_ours / device.bandwidth,
                    }
                )
    return rows


# What sets a kernel's time, for the table: bandwidth, loads in flight (latency), a last
# partial wave, fp32 FMA throughput, K2's routing before its routed blocks can start.
BOUND_LABELS = {"none": "-", "bandwidth": "bw", "latency": "lat", "bandwidth + tail": "bw+tail",
                "compute": "fma"}  # fmt: skip
BOUND_LABELS.update({f"routing + {k}": f"route+{v}" for k, v in list(BOUND_LABELS.items())})


def render(rows: list[dict], markdown: bool) -> str:
    headers = ["preset", "device", "T", "K1 MB", "K1 us", "K2 MB", "K2 us", "K3 MB", "K3 us",
               "step us", "twin us", "x twin", "% HBM", "limits K1/K2/K3"]  # fmt: skip
    body = []
    for r in rows:
        k1, k2, k3 = r["kernels"]
        body.append(
            [r["preset"], r["device"], r["tokens"],
             f"{k1.weight_bytes / 1e6:.1f}", f"{1e6 * k1.seconds:.1f}",
             f"{k2.weight_bytes / 1e6:.1f}", f"{1e6 * k2.seconds:.1f}",
             f"{k3.weight_bytes / 1e6:.1f}", f"{1e6 * k3.seconds:.1f}",
             f"{r['us']:.1f}", f"{r['twin_us']:.1f}", f"{r['speedup']:.2f}", f"{100 * r['hbm_fraction']:.0f}%",
             "/".join(BOUND_LABELS[k.bound] for k in r["kernels"])]
        )  # fmt: skip
    if not markdown:
        return format_table(headers, body, align="ll" + "r" * (len(headers) - 3) + "l")
    lines = ["| " + " | ".join(headers) + " |", "| --- | --- |" + " ---: |" * (len(headers) - 3) + " --- |"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in body]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deamoe_trt.perf_model", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    parser.add_argument("--presets", default="deepseek-v3-layer,qwen3-30b-a3b-layer")
    parser.add_argument("--devices", default="a40,orin,h100,h200", help=f"any of {','.join(DEVICES)}")
    parser.add_argument("--tokens", default="1,4,16")
    parser.add_argument("--ptxas-log", type=Path, help="registers from this `nvcc -Xptxas -v` log (build_kernels.sh)")
    parser.add_argument("--markdown", action="store_true", help="a Markdown table (KERNELS.md)")
    parser.add_argument("--bits", type=int, choices=(4, 8), help="int4/int8 FFN weights (bf16 scales)")
    parser.add_argument("--group-size", type=int, default=128, help="columns per scale with --bits (default 128)")
    args = parser.parse_args(argv)
    try:
        presets = [p for p in args.presets.split(",") if p]
        devices = [d for d in args.devices.split(",") if d]
        tokens = [int(t) for t in args.tokens.split(",") if t]
        unknown = [p for p in presets if p not in PRESETS] + [d for d in devices if d not in DEVICES]
        if unknown or not tokens or any(not 1 <= t <= MAX_TILE_TOKENS for t in tokens):
            raise ValueError(f"unknown preset/device {unknown} or tokens outside 1..{MAX_TILE_TOKENS}")
        registers = None
        if args.ptxas_log:
            text = args.ptxas_log.read_text()
            bits = args.bits or 0
            registers = {arch: parse_ptxas_registers(text, arch, bits=bits) for arch in DEFAULT_REGISTERS}
            missing = [arch for arch, kernels in registers.items() if not set(KERNELS) <= set(kernels)]
            if missing:
                weights = f" int{bits}" if bits else ""
                raise ValueError(
                    f"{args.ptxas_log}: no bf16{weights} register report of every kernel for sm_{missing[0]}"
                )
        quant = QuantConfig(args.bits, args.group_size) if args.bits else None
        for preset in presets if quant else []:
            check_quantizable(PRESETS[preset], quant)
    except (ValueError, OSError, UsageError) as exc:
        print(f"perf_model: {exc}", file=sys.stderr)
        return 2
    print(render(predicted_rows(presets, devices, tokens, registers, quant), args.markdown))
    if not args.markdown:
        source = str(args.ptxas_log) if args.ptxas_log else "this source's ptxas report (DEFAULT_REGISTERS)"
        print(RESTS_ON.format(registers=source))
    return 0


if __name__ == "__main__":
    sys.exit(main())
