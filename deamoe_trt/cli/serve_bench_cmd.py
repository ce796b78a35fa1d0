"""`deamoe-trt serve-bench`: the LM decode service on a real tritonserver here, under load and faults.

Writes a model repository with the decode service, starts tritonserver (from the
nvidia-pytriton wheel) on loopback, and measures one request alone, N streaming clients x M
requests in flight, and alone again; then an HTTP request, a client that disconnects
mid-stream, bad requests and a server killed and restarted under load. Every greedy
response is compared with the prompt decoded alone in this process. Exit 1 if any request
was lost or wrong or a fault check failed.
"""

from __future__ import annotations

from ..integrations.triton.lm_runtimes import lm_runtimes
from ..lm.shipped import PROMPTS_FILE, TINY_LM
from . import args as common


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "serve-bench", help="load and fault test of the LM decode service on tritonserver", description=__doc__
    )
    parser.add_argument(
        "checkpoint",
        metavar="CKPT",
        nargs="?",
        default=str(TINY_LM),
        help="language-model checkpoint (default: the shipped tiny-lm)",
    )
    parser.add_argument(
        "--prompts",
        metavar="FILE",
        default=str(PROMPTS_FILE),
        help="text file of prompts, one a line, rotated over the requests (default: the shipped prompts.txt)",
    )
    parser.add_argument(
        "--runtime",
        choices=lm_runtimes(gpu=False),
        default="ort",
        help="decoder in the server, one that runs on the CPU (default ort; cpu: the CPU kernel's native step, "
        "sequences batched)",
    )
    parser.add_argument("--clients", type=common.positive_int, default=4, help="concurrent gRPC streams (default 4)")
    parser.add_argument(
        "--requests", type=common.positive_int, default=4, help="requests in flight per client (default 4)"
    )
    parser.add_argument("--max-tokens", type=common.positive_int, default=32, help="tokens per request (default 32)")
    parser.add_argument("--no-faults", action="store_true", help="measure load only")
    parser.set_defaults(func=run)


def run(args) -> int:
    import sys

    from ..errors import MissingDependencyError
    from ..integrations.triton.bench import fault_table, load_table, run_bench
    from ..integrations.triton.server import unavailable
    from ..lm.shipped import read_prompts

    prompts = read_prompts(args.prompts)  # bad input is reported before anything starts
    reason = unavailable()
    if reason:
        raise MissingDependencyError(reason)
    result = run_bench(
        args.checkpoint,
        prompts=prompts,
        runtime=args.runtime,
        clients=args.clients,
        requests=args.requests,
        max_tokens=args.max_tokens,
        faults=not args.no_faults,
        log=lambda line: print(line, file=sys.stderr),
    )
    print(load_table(result.loads))
    if result.checks:
        print()
        print(fault_table(result.checks))
    print(f"\ntritonserver started in {result.server_start_s:.1f} s; the machine's load makes every time noisy.")
    return 0 if result.ok else 1
