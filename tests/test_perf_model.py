"""The static performance model: its per-kernel bytes add up to the spec's weights loaded
per step (deamoe_trt.traffic), its times respect the physical floors it is built from,
and its register source is read correctly from ptxas output."""

import pytest
import torch

from deamoe_trt import PRESETS
from deamoe_trt.perf_model import (
    DEFAULT_REGISTERS,
    DEVICES,
    KERNELS,
    QUANT_REGISTERS,
    expected_usage,
    main,
    parse_ptxas_registers,
    predict_step,
)
from deamoe_trt.quant import QuantConfig
from deamoe_trt.traffic import compare_traffic


@pytest.mark.parametrize("name", ["tiny", "qwen3-30b-a3b-layer", "deepseek-v3-layer"])
@pytest.mark.parametrize("tokens", [1, 4, 16])
def test_kernel_bytes_add_up_to_the_weights_loaded_per_step(name, tokens):
    config = PRESETS[name]
    gen = torch.Generator().manual_seed(tokens)
    logits = torch.randn(tokens, config.num_experts, generator=gen)
    bias = 0.05 * torch.randn(config.num_experts, generator=gen) if config.router_bias else None
    for bytes_per_weight in (2, 4):
        traffic = compare_traffic(config, logits, bias, bytes_per_weight)
        for model, twin_config in (("deamoe", config), ("expanded", config.expanded())):
            t = traffic[model]
            kernels = predict_step(twin_config, DEVICES["h200"], tokens, bytes_per_weight,
                                   t.departments_used, t.experts_used)  # fmt: skip
            assert sum(k.weight_bytes for k in kernels) == t.total


@pytest.mark.parametrize("quant", [QuantConfig(4, 128), QuantConfig(8, 64)], ids=["int4-g128", "int8-g64"])
@pytest.mark.parametrize("tokens", [1, 16])
def test_quantized_kernel_bytes_add_up_to_the_packed_weights_loaded(quant, tokens):
    """Codes plus scales, per kernel, sum to traffic's account of the quantized step."""
    config = PRESETS["deepseek-v3-layer"]
    logits = torch.randn(tokens, config.num_experts, generator=torch.Generator().manual_seed(tokens))
    traffic = compare_traffic(config, logits, torch.zeros(config.num_experts), 2, quant)
    for model, twin_config in (("deamoe", config), ("expanded", config.expanded())):
        t = traffic[model]
        kernels = predict_step(twin_config, DEVICES["h200"], tokens, 2, t.departments_used, t.experts_used,
                               quant=quant)  # fmt: skip
        assert sum(k.weight_bytes for k in kernels) == t.total
        quant_registers = {r for regs in QUANT_REGISTERS[quant.bits].values() for r in regs.values()}
        assert {k.registers for k in kernels} <= quant_registers


@pytest.mark.parametrize("bits", [4, 8])
def test_quantized_steps_respect_the_bandwidth_floor_and_sharing_pays(bits):
    config, dev, quant = PRESETS["deepseek-v3-layer"], DEVICES["h200"], QuantConfig(bits, 128)
    ours = predict_step(config, dev, 1, 2, 4, 8, quant=quant)
    twin = predict_step(config.expanded(), dev, 1, 2, 0, 8, quant=quant)
    for kernel in ours + twin:
        assert kernel.seconds >= kernel.weight_bytes / dev.bandwidth
    bytes_ratio = sum(k.weight_bytes for k in twin) / sum(k.weight_bytes for k in ours)
    assert 1.0 < sum(k.seconds for k in twin) / sum(k.seconds for k in ours) <= bytes_ratio * 1.01
    # Fewer bytes than bf16, so a shorter step.
    assert sum(k.seconds for k in ours) < sum(k.seconds for k in predict_step(config, dev, 1, 2, 4, 8))


@pytest.mark.parametrize("device", list(DEVICES))
@pytest.mark.parametrize("tokens", [1, 4, 16])
def test_no_kernel_beats_the_bandwidth_floor_and_sharing_pays(device, tokens):
    config, dev = PRESETS["deepseek-v3-layer"], DEVICES[device]
    u_d, u_e = (round(u) for u in expected_usage(config, tokens))
    ours = predict_step(config, dev, tokens, 2, u_d, u_e)
    twin = predict_step(config.expanded(), dev, tokens, 2, 0, u_e)
    for kernel in ours + twin:
        assert kernel.seconds >= kernel.weight_bytes / dev.bandwidth
    bytes_ratio = sum(k.weight_bytes for k in twin) / sum(k.weight_bytes for k in ours)
    speedup = sum(k.seconds for k in twin) / sum(k.seconds for k in ours)
    assert 1.0 < speedup <= bytes_ratio * 1.01  # fixed costs only pull it under the bytes ratio


def test_programmatic_launch_only_shortens_steps_on_sm90():
    config = PRESETS["qwen3-30b-a3b-layer"]
    for key, device in DEVICES.items():
        graph = sum(k.seconds for k in predict_step(config, device, 1, 2, 2, 8, mode="graph"))
        pdl = sum(k.seconds for k in predict_step(config, device, 1, 2, 2, 8, mode="pdl"))
        assert (pdl < graph) == (device.arch >= 90), key


def test_expected_usage_is_exact_for_one_token():
    config = PRESETS["deepseek-v3-layer"]
    u_d, u_e = expected_usage(config, 1)
    assert u_d == pytest.approx(min(config.top_departments, config.top_k))
    assert u_e == pytest.approx(config.top_k)


def test_registers_are_read_from_ptxas_output():
    def entry(kernel, tt, arch, regs):
        name = f"_ZN6deamoe6detail{len(kernel)}{kernel}I13__nv_bfloat16Li{tt}EEEvNS0_4ArgsIT_EE"
        return (f"ptxas info    : Compiling entry function '{name}' for 'sm_{arch}'\n"
                f"ptxas info    : Function properties for {name}\n"
                "    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
                f"ptxas info    : Used {regs} registers, used 1 barriers, 512 bytes smem\n")  # fmt: skip

    log = entry("downKernel", 16, 90, 111) + entry("downKernel", 16, 86, 99) + entry("routedKernel", 1, 90, 42)
    log += entry("routeKernel", 1, 90, 7).replace("Li1E", "")  # not templated on tokens: ignored
    log += entry("downKernel", 1, 90, 80).replace("Li1E", "Li1ELi4E")  # quantized: BITS 4
    log += entry("downKernel", 2, 90, 66).replace("Li2E", "Li2ELi0E")  # float with the BITS argument
    # The kernel variants beside the default's: a staged down kernel, a routed one with twice the
    # gate/up loads in flight (the default's own trailing arguments: false, and 4 chunks at 1 token).
    log += entry("downKernel", 16, 90, 120).replace("Li16E", "Li16ELi0ELb1E")
    log += entry("routedKernel", 1, 90, 60).replace("Li1E", "Li1ELi0ELi8E")
    log += entry("routedKernel", 2, 90, 44).replace("Li2E", "Li2ELi0ELi4E")
    log += entry("downKernel", 8, 90, 70).replace("Li8E", "Li8ELi0ELb0E")
    assert parse_ptxas_registers(log, 90) == {"downKernel": {16: 111, 2: 66, 8: 70}, "routedKernel": {1: 42, 2: 44}}
    assert parse_ptxas_registers(log, 90, bits=4) == {"downKernel": {1: 80}}
    assert parse_ptxas_registers(log, 86) == {"downKernel": {16: 99}}
    for arch in {d.arch for d in DEVICES.values()}:
        assert set(DEFAULT_REGISTERS[arch]) == {"routerSharedKernel", "routedKernel", "downKernel"}


def test_a_given_register_report_is_used_for_quantized_kernels_too():
    # --ptxas-log with --bits: the build's int4 report, not the built-in table, sets occupancy.
    config, device, quant = PRESETS["deepseek-v3-layer"], DEVICES["h200"], QuantConfig(4, 128)
    report = {device.arch: {kernel: dict.fromkeys((1, 2, 4, 8, 16), 200) for kernel in KERNELS}}
    given = predict_step(config, device, 1, 2, 2, 8, registers=report, quant=quant)
    built_in = predict_step(config, device, 1, 2, 2, 8, quant=quant)
    assert [k.registers for k in given] == [200, 200, 200]
    assert [k.registers for k in built_in] == [QUANT_REGISTERS[4][kernel][1] for kernel in KERNELS]


def test_cli_prints_a_markdown_table_and_rejects_unknown_devices(capsys):
    assert main(["--markdown", "--devices", "h200", "--tokens", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| preset |") and len(lines) == 2 + 2  # header, rule, two presets
    assert main(["--devices", "h300"]) == 2
    assert "h300" in capsys.readouterr().err


def test_the_plain_table_says_what_it_rests_on(capsys):
    assert main(["--devices", "orin", "--tokens", "1", "--presets", "deepseek-v3-layer"]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last.startswith("Rests on: datasheet") and "Not calibrated on a GPU" in last and "DEFAULT_REGISTERS" in last
