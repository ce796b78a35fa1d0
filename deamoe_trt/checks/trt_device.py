"""The DeaMoE TensorRT device check: run once on a machine with a GPU and TensorRT.

    deamoe-trt check-trt OUT_DIR [--presets tiny,qwen3-30b-a3b-layer] [--dtype fp16]
        [--tokens 1,2,4,8,16] [--plugin PATH] [--tensorrt-root DIR] [--tensorrt-include DIR]
        [--routes auto|cpp|python|cpp,python] [--target auto] [--keep]

Steps (each one's failure is recorded and the script goes on with what does not depend on it):
 1. environment: GPU, driver, TensorRT, torch; `deamoe-trt doctor`'s table
 2. kernels: deamoe_trt.cuda against the PyTorch reference (tiny preset)
 3. plugin: cmake -S plugins -B OUT_DIR/work/build-plugins -DTENSORRT_ROOT=... for this GPU's
    architecture (skipped with --plugin PATH)
 4. per preset: a random checkpoint, its plugin-form ONNX export and that of its expanded
    twin (layer.expanded(): same routing, shared neurons copied into every expert)
 5. per preset and route (cpp: the library, python: tensorrt.plugin): build both engines
    with `deamoe-trt build`'s code, validate each against its PyTorch reference, and time
    each engine (the engine is the one layer) at every token count with CUDA events
Results: OUT_DIR/results.json, rewritten after every step (a killed run keeps what it had);
progress lines on stderr. Exit 0 when every step that ran passed and at least one engine
was built and validated, 1 otherwise.

--tensorrt-include: for a pip-installed TensorRT (no headers), the include/ folder of the
TensorRT OSS repository at the matching release tag; the script pairs it with the wheel's
libnvinfer in OUT_DIR/work/tensorrt-root to build the C++ plugin.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from ..bench.timing import percentile
from ..checkout import ENV_VAR as CHECKOUT_VAR
from ..checkout import checkout_root
from ..dtypes import BY_NAME, BY_TRT

PRESETS = ("tiny", "qwen3-30b-a3b-layer")
FLUSH_BYTES = 1 << 30
ROUTES = ("cpp", "python")


class Skip(Exception):
    """A step that cannot run here (not a failure): missing TensorRT, GPU, or an earlier step."""


class Check:
    def __init__(self, out: Path, args: Any):  # TrtCheckOptions, or check-edgellm's: the fields each step reads
        self.out, self.args = out, args
        self.work = out / "work"
        self.work.mkdir(parents=True, exist_ok=True)
        self.start = time.perf_counter()
        self.results: dict = {
            "script": "deamoe-trt check-trt (deamoe_trt/checks/trt_device.py)",
            "arguments": {k: v for k, v in vars(args).items() if k != "out"},
            "started": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "environment": {},
            "steps": [],
            "validation": [],
            "timing": [],
        }
        self.plugin_path: str | None = args.plugin
        self.models: dict[tuple[str, str], dict] = {}  # (preset, variant) -> paths

    # -- bookkeeping ----------------------------------------------------------------------

    def say(self, text: str) -> None:
        print(f"[device-check {time.perf_counter() - self.start:7.1f}s] {text}", file=sys.stderr, flush=True)

    def save(self) -> None:
        steps = self.results["steps"]
        self.results["summary"] = {
            "ok": sum(s["status"] == "ok" for s in steps),
            "failed": sum(s["status"] == "failed" for s in steps),
            "skipped": sum(s["status"] == "skipped" for s in steps),
            "engines_validated": sum(v["passed"] for v in self.results["validation"]),
            "seconds": round(time.perf_counter() - self.start, 1),
        }
        tmp = self.out / ".results.json.tmp"
        tmp.write_text(json.dumps(self.results, indent=2, default=str) + "\n")
        os.replace(tmp, self.out / "results.json")

    def step(self, name: str, fn, *args):
        """Run fn(*args) as one recorded step; returns its result, or None if it failed/skipped."""
        self.say(f"{name} ...")
        began = time.perf_counter()
        record: dict[str, Any] = {"name": name, "status": "ok", "seconds": None, "details": None, "error": None}
        result = None
        try:
            result = fn(*args)
            record["details"] = result if _jsonable(result) else None
        except Skip as exc:
            record["status"], record["error"] = "skipped", str(exc)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:
            record["status"] = "failed"
            record["error"] = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
            record["traceback"] = traceback.format_exc(limit=8)
        record["seconds"] = round(time.perf_counter() - began, 2)
        self.results["steps"].append(record)
        self.save()
        status = record["status"] + (f": {record['error']}" if record["error"] else "")
        self.say(f"{name}: {status} ({record['seconds']}s)")
        return result if record["status"] == "ok" else None

    # -- steps ------------------------------------------------------------------------------

    def environment(self) -> dict:
        import torch

        from deamoe_trt.trt import has_tensorrt, import_tensorrt
        from deamoe_trt.trt.doctor import run_doctor

        env: dict[str, Any] = {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "torch": torch.__version__,
            "torch_cuda": torch.version.cuda if torch.cuda.is_available() else None,
        }
        try:
            from deamoe_trt.trt.device import query_gpu

            gpu = query_gpu()
            env["gpu"] = {
                "name": gpu.name,
                "compute_capability": gpu.cc,
                "memory_gib": round(gpu.total_memory / 2**30, 1),
                "driver": gpu.driver_version,
                "integrated": gpu.integrated,
            }
        except Exception as exc:
            env["gpu"] = f"none: {exc}"
        env["tensorrt"] = import_tensorrt().__version__ if has_tensorrt() else None
        report = run_doctor(self.plugin_path)
        env["doctor"] = report.table().splitlines()
        self.results["environment"] = env
        print(report.table(), file=sys.stderr)
        return {k: v for k, v in env.items() if k != "doctor"}

    def kernels(self) -> str:
        from deamoe_trt.errors import MissingDependencyError
        from deamoe_trt.trt.doctor import kernel_self_test

        try:
            return kernel_self_test()
        except MissingDependencyError as exc:
            raise Skip(str(exc)) from None

    def build_plugin(self) -> str:
        if self.plugin_path:
            return f"given: {self.plugin_path}"
        from deamoe_trt.trt.device import query_gpu

        root = self.args.tensorrt_root or os.environ.get("TENSORRT_ROOT") or self._assemble_root() or _system_root()
        if root is None:
            raise Skip("no TensorRT headers (pass --tensorrt-root, or --tensorrt-include for a pip TensorRT)")
        checkout = checkout_root()  # plugins/ is not in the package
        if checkout is None:
            raise Skip(f"the plugin's sources are in a deamoe-trt checkout: set {CHECKOUT_VAR}, or pass --plugin")
        major, minor = query_gpu().compute_capability
        build = self.work / "build-plugins"
        configure = ["cmake", "-S", str(checkout / "plugins"), "-B", str(build), f"-DTENSORRT_ROOT={root}",
                     f"-DCMAKE_CUDA_ARCHITECTURES={major}{minor}", "-DCMAKE_BUILD_TYPE=Release"]  # fmt: skip
        nvcc = shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc"
        if Path(nvcc).is_file():
            configure.append(f"-DCMAKE_CUDA_COMPILER={nvcc}")
        for cmd in (configure, ["cmake", "--build", str(build), "-j", str(os.cpu_count() or 2)]):
            self.say("  $ " + " ".join(cmd))
            done = subprocess.run(cmd, capture_output=True, text=True)
            (self.work / "plugin-build.log").open("a").write(done.stdout + done.stderr)
            if done.returncode != 0:
                tail = (done.stdout + done.stderr).strip().splitlines()[-15:]
                raise RuntimeError(f"{cmd[0]} {cmd[1]} failed: " + " | ".join(tail))
        library = build / "libdeamoe_plugin.so"
        if not library.is_file():
            raise RuntimeError(f"the build finished without {library}")
        self.plugin_path = str(library)
        return str(library)

    def _assemble_root(self) -> str | None:
        """include/ from --tensorrt-include + the wheel's libnvinfer, as one TENSORRT_ROOT."""
        if not self.args.tensorrt_include:
            return None
        import tensorrt

        libs = sorted(Path(tensorrt.__file__).resolve().parent.parent.glob("tensorrt_libs/libnvinfer.so.*"))
        if not libs:
            raise RuntimeError(
                "--tensorrt-include given, but no tensorrt_libs/libnvinfer.so.* next to the tensorrt wheel"
            )
        root = self.work / "tensorrt-root"
        (root / "lib").mkdir(parents=True, exist_ok=True)
        include = root / "include"
        if include.is_symlink() or include.exists():
            include.unlink()
        include.symlink_to(Path(self.args.tensorrt_include).resolve())
        link = root / "lib" / "libnvinfer.so"
        if link.is_symlink() or link.exists():
            link.unlink()
        link.symlink_to(libs[0])
        return str(root)

    def export(self, preset: str) -> dict:
        from deamoe_trt import DeaMoEStack, get_preset
        from deamoe_trt.export import export

        config = get_preset(preset)
        stack = DeaMoEStack.random(config, 1, seed=self.args.seed)
        twin = stack.expanded()
        dtype = self.args.dtype
        files = {}
        for variant, module in (("deamoe", stack), ("expanded", twin)):
            ckpt = self.work / f"{preset}-{variant}-ckpt"
            module.save_pretrained(ckpt)
            onnx_path = export(module.layers[0], self.work / f"{preset}-{variant}-{dtype}.onnx", "plugin", dtype,
                               max_tokens=max(self.args.tokens))  # fmt: skip
            self.models[(preset, variant)] = {"checkpoint": ckpt, "onnx": onnx_path}
            files[variant] = str(onnx_path)
        del stack, twin
        return files

    def build(self, preset: str, variant: str, route: str) -> dict:
        from deamoe_trt.trt.builder import BuildOptions, build_engine

        paths = self.models.get((preset, variant))
        if paths is None:
            raise Skip("its export failed")
        plugin = self._plugin_for(route)
        result = build_engine(
            BuildOptions(
                model=paths["onnx"],
                output=self.work / f"{preset}-{variant}-{route}.engine",
                target=self.args.target,
                max_tokens=max(self.args.tokens),
                plugin=plugin,
                timing_cache=str(self.work / "timing.cache"),
            )
        )
        paths[f"engine-{route}"] = result.engine
        return {"lines": result.lines(), "seconds": round(result.seconds, 1)}

    def validate(self, preset: str, variant: str, route: str) -> dict:
        from deamoe_trt.validation import validate

        paths = self.models.get((preset, variant), {})
        engine = paths.get(f"engine-{route}")
        if engine is None:
            raise Skip("no engine (its build failed or was skipped)")
        tokens = tuple(t for t in (1, 4, 16) if t <= max(self.args.tokens)) or (1,)
        report = validate(engine, paths["checkpoint"], tokens=tokens, plugin=self._plugin_for(route))
        rows = [dataclasses.asdict(r) for r in report.rows]
        entry = {"preset": preset, "variant": variant, "route": route, "dtype": self.args.dtype,
                 "passed": report.passed, "atol": report.atol, "rtol": report.rtol, "rows": rows}  # fmt: skip
        self.results["validation"].append(entry)
        print(report.table(), file=sys.stderr)
        if not report.passed:
            raise RuntimeError(report.failure())
        return {"passed": True, "worst_max_abs": max(r["max_abs"] for r in rows)}

    def time_pair(self, preset: str, route: str) -> list:
        import torch

        if not torch.cuda.is_available():
            raise Skip("timing uses torch CUDA tensors and events; torch has no CUDA here")
        engines = {}
        for variant in ("deamoe", "expanded"):
            engine = self.models.get((preset, variant), {}).get(f"engine-{route}")
            if engine is None:
                raise Skip(f"no {variant} engine")
            engines[variant] = engine
        timings = {v: _time_engine(e, self._plugin_for(route), self.args) for v, e in engines.items()}
        traffic = _traffic(self.models[(preset, "deamoe")]["checkpoint"], self.args)
        rows = []
        for tokens in self.args.tokens:
            a, b = timings["deamoe"][tokens], timings["expanded"][tokens]
            row = {"preset": preset, "route": route, "dtype": self.args.dtype, "tokens": tokens,
                   "deamoe_ms": a["median_ms"], "expanded_ms": b["median_ms"],
                   "speedup": round(b["median_ms"] / a["median_ms"], 3),
                   "deamoe_p90_ms": a["p90_ms"], "expanded_p90_ms": b["p90_ms"], **traffic[tokens]}  # fmt: skip
            rows.append(row)
            self.results["timing"].append(row)
        return rows

    def _plugin_for(self, route: str) -> str:
        if route == "python":
            return "python"
        if not self.plugin_path:
            raise Skip("no plugin library (its build failed or was skipped)")
        return self.plugin_path

    def routes(self) -> list[str]:
        if self.args.routes != "auto":
            return list(self.args.routes)
        from deamoe_trt.trt import has_tensorrt, tensorrt_version

        routes = ["cpp"]
        if has_tensorrt() and tensorrt_version() >= (10, 6):
            routes.append("python")
        return routes


def _system_root() -> str | None:
    from deamoe_trt.trt.doctor import tensorrt_header_dirs

    for d in tensorrt_header_dirs():
        if (d / "NvInferRuntime.h").is_file():
            return str(d.parent.parent if d.parent.name == "include" else d.parent)
    return None


def _jsonable(value) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def _time_engine(path: Path, plugin: str, args) -> dict[int, dict]:
    """Median/p90 GPU time of one execute_async_v3 per token count, between CUDA events."""
    import torch

    from deamoe_trt.inputs import random_hidden
    from deamoe_trt.runtimes.tensorrt import load_engine

    trt, engine = load_engine(path, plugin)
    context = engine.create_execution_context()
    names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
    inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
    outputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]
    dtype = BY_TRT[engine.get_tensor_dtype(inputs[0]).name].torch
    hidden = int(engine.get_tensor_shape(inputs[0])[1])
    stream = torch.cuda.Stream()
    # Read before every timed run: evicts the weights from L2 (a small layer's weights fit
    # in an H200's 60 MB L2, which would flatter the timing) and keeps the GPU busy while
    # the host enqueues the run.
    flush = torch.empty(FLUSH_BYTES // 4, device="cuda").uniform_()
    results = {}
    for tokens in args.tokens:
        x = random_hidden(tokens, hidden, seed=args.seed + tokens).to(dtype).cuda()
        context.set_input_shape(inputs[0], (tokens, hidden))
        y = torch.empty(tuple(context.get_tensor_shape(outputs[0])), dtype=dtype, device="cuda")
        context.set_tensor_address(inputs[0], x.data_ptr())
        context.set_tensor_address(outputs[0], y.data_ptr())
        torch.cuda.synchronize()
        for _ in range(args.warmup):
            context.execute_async_v3(stream.cuda_stream)
        times = []
        for _ in range(args.iterations):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with torch.cuda.stream(stream):
                flush.amax()
            start.record(stream)
            if not context.execute_async_v3(stream.cuda_stream):
                raise RuntimeError(f"execute_async_v3 failed at {tokens} token(s)")
            end.record(stream)
            end.synchronize()
            times.append(start.elapsed_time(end))
        results[tokens] = {
            "median_ms": round(statistics.median(times), 5),
            "p90_ms": round(percentile(times, 90), 5),
            "l2_flushed": True,
        }
    return results


def _traffic(checkpoint: Path, args) -> dict[int, dict]:
    """Bytes of weights each timed batch reads, DeaMoE vs the expanded twin (routing of the fp32 reference)."""
    from deamoe_trt import DeaMoEStack
    from deamoe_trt.inputs import random_hidden
    from deamoe_trt.routing import router_logits
    from deamoe_trt.traffic import compare_traffic

    layer = DeaMoEStack.from_pretrained(checkpoint).layers[0]
    config = layer.config
    width = BY_NAME[args.dtype].bytes
    out = {}
    for tokens in args.tokens:
        x = random_hidden(tokens, config.hidden_size, seed=args.seed + tokens)
        logits = router_logits(x, layer.router.weight, layer.router.logit_bias)
        bytes_ = compare_traffic(config, logits, layer.router.bias, width)
        deamoe, expanded = bytes_["deamoe"].total, bytes_["expanded"].total
        out[tokens] = {"deamoe_bytes": deamoe, "expanded_bytes": expanded, "bytes_ratio": round(deamoe / expanded, 4)}
    return out


@dataclasses.dataclass
class TrtCheckOptions:
    """What to check, as the command's flags say (deamoe-trt check-trt --help)."""

    out: Path
    presets: list[str] = dataclasses.field(default_factory=lambda: list(PRESETS))
    dtype: str = "fp16"
    tokens: list[int] = dataclasses.field(default_factory=lambda: [1, 2, 4, 8, 16])  # ascending, each once
    iterations: int = 200
    warmup: int = 20
    plugin: str | None = None  # a built plugin library (skips the CMake build)
    tensorrt_root: str | None = None
    tensorrt_include: str | None = None
    routes: str | list[str] = "auto"  # "auto" or a subset of ROUTES
    target: str = "auto"
    seed: int = 0
    keep: bool = False


def run_check(args: TrtCheckOptions) -> int:
    """Run the check; 0 when every step that ran passed and an engine was validated."""
    args.out.mkdir(parents=True, exist_ok=True)
    check = Check(args.out, args)
    check.step("environment", check.environment)
    check.step("kernels: deamoe_trt.cuda vs reference", check.kernels)
    routes = check.routes()
    if "cpp" in routes:
        check.step("plugin library: cmake build", check.build_plugin)
    for preset in args.presets:
        check.step(f"{preset}: checkpoint + plugin-form export (DeaMoE and expanded twin)", check.export, preset)
        for route in routes:
            for variant in ("deamoe", "expanded"):
                check.step(f"{preset}/{variant}/{route}: build engine", check.build, preset, variant, route)
                check.step(f"{preset}/{variant}/{route}: validate vs reference", check.validate, preset, variant, route)
            check.step(
                f"{preset}/{route}: time DeaMoE vs expanded at {args.tokens} tokens", check.time_pair, preset, route
            )
        # Large presets' files go as soon as they are done with (the qwen3 layer is gigabytes).
        if not args.keep:
            for path in check.work.glob(f"{preset}-*"):
                shutil.rmtree(path) if path.is_dir() else path.unlink()
    check.results["finished"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    check.save()
    if not args.keep:
        shutil.rmtree(check.work, ignore_errors=True)
    summary = check.results["summary"]
    for row in check.results["timing"]:
        check.say(
            f"{row['preset']} {row['route']} T={row['tokens']}: DeaMoE {row['deamoe_ms']:.4f} ms, expanded "
            f"{row['expanded_ms']:.4f} ms, speedup {row['speedup']:.2f}x (bytes ratio {row['bytes_ratio']:.3f})"
        )
    check.say(
        f"done: {summary['ok']} ok, {summary['failed']} failed, {summary['skipped']} skipped; "
        f"{args.out / 'results.json'}"
    )
    if summary["engines_validated"] == 0:
        check.say("no engine was built and validated: this is not a pass (see the skipped steps' reasons)")
        return 1
    return 0 if summary["failed"] == 0 else 1
