import pytest

from deamoe_trt.errors import MissingDependencyError
from deamoe_trt.lm import get_lm_preset
from deamoe_trt.runtimes.tensorrt import TrtDecoder
from deamoe_trt.trt._tensorrt import has_tensorrt
from deamoe_trt.trt.lm_engine import DECODE, PREFILL, build_lm_engine, lm_profiles


def test_profiles_cover_prefill_and_decode():
    c = get_lm_preset("tiny-lm")
    profiles = lm_profiles(c)
    prefill, decode = profiles[PREFILL], profiles[DECODE]
    assert prefill["input_ids"] == ((1, 1), (1, 64), (1, 256))
    assert prefill["past_key_values.2.value"] == ((1, 2, 0, 32),) * 3
    assert decode["input_ids"] == ((1, 1),) * 3
    assert decode["past_key_values.0.key"] == ((1, 2, 1, 32), (1, 2, 128, 32), (1, 2, 255, 32))
    assert len(prefill) == len(decode) == 1 + 2 * c.num_layers


@pytest.mark.skipif(has_tensorrt(), reason="TensorRT is installed here")
def test_without_tensorrt_the_message_says_how_to_get_it(tmp_path):
    c = get_lm_preset("tiny-lm")
    with pytest.raises(MissingDependencyError, match="TensorRT is not installed"):
        build_lm_engine(tmp_path / "m.onnx", tmp_path / "m.engine", c)
    with pytest.raises(MissingDependencyError, match="TensorRT is not installed"):
        TrtDecoder(tmp_path / "m.engine", c)
