"""The export itself, run by the Python that has Edge-LLM (`python -m deamoe_trt.integrations.edgellm.driver LM OUT`).

Loads the DeaMoE LM, writes its Hugging Face view (source.py) to a scratch folder, and runs
Edge-LLM's own exporter (`tensorrt-edgellm-export`'s main) on it with the DeaMoE family
installed (family.py). OUT receives what Edge-LLM writes (llm/model.onnx, .data,
config.json, embedding.safetensors, tokenizer files, chat_template.jinja) and
deamoe_trt.json, which says which plugin library the engine build must load.

Errors: a DeaMoEError prints one line on stderr and exits with its code (2: bad input,
such as an Edge-LLM version outside the tested range); anything Edge-LLM raises exits 1
with its last line. The caller (deamoe_trt.integrations.edgellm.export_edgellm) writes OUT as
a temporary folder and renames it only on success.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
from pathlib import Path

from ... import contract
from ...errors import DeaMoEError, one_line
from . import SIDECAR, check_version


def run(lm_dir: Path, out: Path) -> dict:
    import tensorrt_edgellm

    check_version(tensorrt_edgellm.__version__)
    from tensorrt_edgellm.scripts import export as edgellm_cli

    from ...lm.checkpoint import load_lm
    from . import family, source

    loaded = load_lm(lm_dir)
    model = loaded.model
    source.check_representable(model.config, str(lm_dir))
    source.check_tokenizer(loaded.tokenizer, lm_dir)
    with tempfile.TemporaryDirectory(prefix="deamoe-edgellm-") as scratch:
        hf_dir = Path(scratch) / "hf"
        layers = source.write_hf_dir(model, loaded.tokenizer, lm_dir, hf_dir)
        del model, loaded
        with family.installed(layers):
            argv, sys.argv = sys.argv, ["tensorrt-edgellm-export", str(hf_dir), str(out)]
            try:
                edgellm_cli.main()
            finally:
                sys.argv = argv
    quant = next(iter(layers.values())).quant if layers else None
    sidecar = {
        "format": "deamoe-trt-edgellm",
        "format_version": "1",
        "edgellm_version": tensorrt_edgellm.__version__,
        "source_lm": str(lm_dir.resolve()),
        "moe_layers": sorted(layers),
        "plugin": {
            "op_type": contract.OP_TYPE,
            "domain": contract.DOMAIN,
            "version": contract.PLUGIN_VERSION,
            "namespace": contract.PLUGIN_NAMESPACE,
            "library": "libdeamoe_plugin.so",
        },
        "weight_bits": quant.bits if quant else 0,
    }
    (out / SIDECAR).write_text(json.dumps(sidecar, indent=2) + "\n")
    return sidecar


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m deamoe_trt.integrations.edgellm.driver", description=__doc__.split("\n")[0]
    )
    parser.add_argument("lm", type=Path)
    parser.add_argument("out", type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    try:
        run(args.lm, args.out)
    except DeaMoEError as exc:
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return exc.exit_code
    except ModuleNotFoundError as exc:
        print(f"error: Edge-LLM export needs {exc.name}: {one_line(exc)}", file=sys.stderr)
        return 1
    except Exception as exc:  # Edge-LLM's own failures: one line, and the traceback above it
        import traceback

        traceback.print_exc()
        print(f"error: Edge-LLM's exporter failed: {type(exc).__name__}: {one_line(exc, first=True)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
