"""The LM decode service on a real tritonserver (the nvidia-pytriton wheel's binary), on loopback.

One server start for the module. The load-and-fault test is the issue's acceptance check and
runs in CI (the default `pytest` run includes slow tests); it skips, saying why, only where
the wheel or its Python environment is missing (see deamoe_trt/serving/server.py).
"""

from pathlib import Path

import pytest

from deamoe_trt.serving import load_test
from deamoe_trt.serving.repo import write_lm_model
from deamoe_trt.serving.server import TritonServer, unavailable

TINY_LM = Path(__file__).resolve().parents[2] / "samples" / "models" / "tiny-lm"
REASON = unavailable()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(REASON is not None, reason=f"no tritonserver here: {REASON}")]
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def expected():
    return load_test.expected_outputs(TINY_LM, list(load_test.PROMPTS), MAX_TOKENS)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("triton")
    write_lm_model(folder / "repo", TINY_LM, name=load_test.MODEL)
    with TritonServer(folder / "repo", workdir=folder, start_timeout_s=180) as running:
        yield running


def test_http_client_sees_a_ready_decoupled_model_and_streams_the_same_tokens(server, expected):
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(server.http_url)
    assert client.is_server_live() and client.is_model_ready(load_test.MODEL)
    assert client.get_model_config(load_test.MODEL)["model_transaction_policy"]["decoupled"] is True
    prompt = load_test.PROMPTS[2]
    outcome = load_test.generate_over_http(server.http_url, prompt, MAX_TOKENS)
    assert outcome.error is None and outcome.ids == expected[prompt] and outcome.finish == "length"
    assert len(outcome.arrivals_s) == MAX_TOKENS  # streamed: one event per token


def test_sampling_parameters_reach_the_model(server):
    prompt = "Anne was"
    first = load_test.one_request(server.grpc_url, prompt, 24, temperature=1.0, top_p=0.9, random_seed=5)
    again = load_test.one_request(server.grpc_url, prompt, 24, temperature=1.0, top_p=0.9, random_seed=5)
    other = load_test.one_request(server.grpc_url, prompt, 24, temperature=1.0, top_p=0.9, random_seed=6)
    assert first.complete and first.ids == again.ids and first.ids != other.ids
    stopped = load_test.one_request(server.grpc_url, prompt, 24, stop_words=[first.text[3:5]])
    greedy = load_test.one_request(server.grpc_url, prompt, 24)
    stop = first.text[3:5]
    if stop in greedy.text:
        assert stopped.finish == "stop" and stopped.text == greedy.text[: greedy.text.index(stop) + len(stop)]
    else:
        assert stopped.finish == "length" and stopped.ids == greedy.ids


def test_load_and_faults(server, expected):
    """N streams x M requests in flight: nothing lost, duplicated or mixed (each equal to its prompt
    alone); then a client that disconnects, bad requests, and a kill and restart under load."""
    loaded = load_test.run_load(
        server.grpc_url, clients=3, requests=3, max_tokens=MAX_TOKENS, expected=expected, label="load"
    )
    assert len(loaded.outcomes) == 9 and loaded.lost == 0 and loaded.wrong == 0, load_test.load_table([loaded])
    assert all(o.finish == "length" and len(o.ids) == MAX_TOKENS for o in loaded.outcomes)
    checks = [load_test.check_disconnect(server.grpc_url, server.metrics_url, expected)]
    checks += load_test.check_bad_requests(server.grpc_url, expected, max_context=256)
    checks.append(load_test.check_restart(server, expected, clients=3))
    assert all(c.passed for c in checks), load_test.fault_table(checks)
    assert len(checks) == 9
