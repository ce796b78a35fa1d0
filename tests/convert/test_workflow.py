"""convert/workflow.py: the method checks the `convert` command's request goes through."""

import pytest

from configs import QWEN2_STYLE_GATED_SHARED
from deamoe_trt.convert.workflow import ConvertRequest, check_method
from deamoe_trt.errors import UsageError

VANILLA = QWEN2_STYLE_GATED_SHARED  # f_s = 0


def test_pruned_keeps_the_rounded_fraction_and_asks_for_one_department_with_nothing_shared():
    f = VANILLA.expert_intermediate_size
    request = ConvertRequest("src", "out", method="pruned", keep_fraction=0.3)
    checked, size = check_method(request, VANILLA)
    assert size == round(0.3 * f) and 0 < size < f
    assert (checked.departments, checked.top_departments, checked.shared_size) == (1, 1, 0)
    assert request.departments is None  # the caller's request is left as it was


def test_top_k_is_the_size_and_must_be_below_the_sources():
    checked, size = check_method(ConvertRequest("src", "out", method="top-k", top_k=VANILLA.top_k - 1), VANILLA)
    assert size == VANILLA.top_k - 1 and checked.shared_size == 0
    with pytest.raises(UsageError, match=f"must be below the source's top-{VANILLA.top_k}"):
        check_method(ConvertRequest("src", "out", method="top-k", top_k=VANILLA.top_k), VANILLA)


def test_the_deamoe_conversion_names_every_missing_option_and_sizes_nothing():
    with pytest.raises(UsageError, match="needs --departments, --top-departments, --shared-size or --shared-fraction"):
        check_method(ConvertRequest("src", "out"), VANILLA)
    request = ConvertRequest("src", "out", departments=2, top_departments=1, shared_fraction=0.5)
    assert check_method(request, VANILLA) == (request, None)
