"""`deamoe-trt convert --method pruned|top-k`: the flags that write one of the report's
alternatives to the DeaMoE conversion (experts pruned to a fraction of their neurons, or a
lower top-k) as a checkpoint of the source's kind (convert.workflow builds, heals and writes
it as the report does)."""

from __future__ import annotations

from ..convert.workflow import METHODS
from . import args as common

open_fraction = common.number("a number in (0, 1)", lambda v: 0 < v < 1)


def add_arguments(parser) -> None:
    parser.add_argument(
        "--method",
        choices=METHODS,
        default="deamoe",
        help="deamoe (default): departments and shared parts; pruned: every expert keeps its most important "
        "neurons (--keep-fraction); top-k: the source's experts with a lower top-k (--top-k); both healed with "
        "--heal-steps as the report heals them",
    )
    parser.add_argument(
        "--keep-fraction",
        type=open_fraction,
        metavar="X",
        help="--method pruned: each expert keeps round(X f) of its f neurons, 0 < X < 1",
    )
    parser.add_argument(
        "--top-k", type=common.positive_int, metavar="K", help="--method top-k: experts per token, below the source's"
    )
