"""`deamoe-trt check-edgellm`: TensorRT Edge-LLM on a GPU, our export against the vanilla model's."""

from __future__ import annotations

import argparse
from pathlib import Path

from . import args as common


def register(subparsers) -> None:
    from ..integrations.edgellm import device_check as check

    summary = "on a GPU with TensorRT Edge-LLM: our export and the vanilla model's, engines, tokens and TPOT"
    parser = subparsers.add_parser(
        "check-edgellm", help=summary, description=check.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out", type=common.writable_directory, help="folder for results.json and work/")
    parser.add_argument("--hf-dir", required=True, type=Path, help="the vanilla Hugging Face model (Qwen3-MoE)")
    parser.add_argument("--lm", help="its DeaMoE LM checkpoint (default: import-hf of --hf-dir)")
    parser.add_argument("--edgellm-build", default="", help="TensorRT Edge-LLM's build folder (its examples/llm/)")
    parser.add_argument("--edgellm-python", help="the Python that has tensorrt-edgellm (default: .venv-edgellm)")
    parser.add_argument("--plugin", help="a built libdeamoe_plugin.so (skips the CMake build)")
    parser.add_argument("--tensorrt-root", help="TensorRT prefix for the plugin build (default: TENSORRT_ROOT, /usr)")
    parser.add_argument("--tensorrt-include", help="TensorRT headers for a pip TensorRT (see check-trt)")
    parser.add_argument("--prompt", action="append", help="a user message (repeatable; default: two built in)")
    parser.add_argument("--tokens", type=common.positive_int, default=64, help="tokens to generate per prompt (64)")
    parser.add_argument(
        "--max-kv-cache", type=common.positive_int, default=4096, help="llm_build's --maxKVCacheCapacity (4096)"
    )
    parser.add_argument("--dry-run", action="store_true", help="run steps 1-3, print the device steps' commands")
    parser.set_defaults(func=run)


def run(args) -> int:
    from ..errors import UsageError
    from ..integrations.edgellm.device_check import PROMPTS, EdgeLLMCheckOptions, run_check

    if args.tokens < 4:
        raise UsageError(f"--tokens must be at least 4 (TPOT needs two lengths), got {args.tokens}")
    if not (args.hf_dir / "config.json").is_file():
        raise UsageError(f"--hf-dir {args.hf_dir} has no config.json: give the Hugging Face model's folder")
    return run_check(
        EdgeLLMCheckOptions(
            out=Path(args.out),
            hf_dir=args.hf_dir,
            lm=args.lm,
            edgellm_build=args.edgellm_build,
            edgellm_python=args.edgellm_python,
            plugin=args.plugin,
            tensorrt_root=args.tensorrt_root,
            tensorrt_include=args.tensorrt_include,
            prompt=args.prompt or list(PROMPTS),
            tokens=args.tokens,
            max_kv_cache=args.max_kv_cache,
            dry_run=args.dry_run,
        )
    )
