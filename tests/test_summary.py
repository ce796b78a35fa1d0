"""deamoe_trt.summary: the figures `info` prints."""

import torch

from configs import GPT_OSS_STYLE
from deamoe_trt import DeaMoEStack
from deamoe_trt.summary import traffic_table


def test_traffic_table_routes_with_the_logit_bias():
    stack = DeaMoEStack.random(GPT_OSS_STYLE, 1, seed=0)
    with torch.no_grad():  # a logit bias that sends every token to department 0's 4 experts
        stack.layers[0].router.logit_bias.copy_(torch.tensor([100.0] * 4 + [0.0] * 12))
    table = traffic_table(stack, [1, 16], samples=2)
    rows = [line.split() for line in table.splitlines() if line.split()[:1] in (["1"], ["16"])]
    assert [row[1:3] for row in rows] == [["1.0", "4.0"], ["1.0", "4.0"]], table
