"""The LM decode service on a real tritonserver (the nvidia-pytriton wheel's binary), on loopback.

One server for the module's client tests; serve-bench starts its own. The load-and-fault
test (serve-bench) is the issue's acceptance check and runs in CI (the default `pytest` run
includes slow tests); it skips, saying why, only where the wheel or its Python environment
is missing (see deamoe_trt/integrations/triton/server.py).
"""

import pytest

from deamoe_trt.cli.main import main
from deamoe_trt.errors import DeaMoEError
from deamoe_trt.integrations.triton import bench as serve_load
from deamoe_trt.integrations.triton.repo import write_lm_model
from deamoe_trt.integrations.triton.server import TritonServer, unavailable
from deamoe_trt.lm.shipped import TINY_LM

REASON = unavailable()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(REASON is not None, reason=f"no tritonserver here: {REASON}")]
MAX_TOKENS = 16


@pytest.fixture(scope="module")
def expected():
    return serve_load.expected_outputs(TINY_LM, list(serve_load.PROMPTS), MAX_TOKENS)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("triton")
    write_lm_model(folder / "repo", TINY_LM, name=serve_load.MODEL)
    with TritonServer(folder / "repo", workdir=folder, start_timeout_s=180) as running:
        yield running


def test_http_client_sees_a_ready_decoupled_model_and_streams_the_same_tokens(server, expected):
    import tritonclient.http as httpclient

    client = httpclient.InferenceServerClient(server.http_url)
    assert client.is_server_live() and client.is_model_ready(serve_load.MODEL)
    assert client.get_model_config(serve_load.MODEL)["model_transaction_policy"]["decoupled"] is True
    prompt = serve_load.PROMPTS[2]
    outcome = serve_load.generate_over_http(server.http_url, prompt, MAX_TOKENS)
    assert outcome.error is None and outcome.ids == expected[prompt] and outcome.finish == "length"
    assert len(outcome.arrivals_s) == MAX_TOKENS  # streamed: one event per token


def test_sampling_parameters_reach_the_model(server):
    prompt = "Anne was"
    first = serve_load.one_request(server.grpc_url, prompt, 24, temperature=1.0, top_p=0.9, random_seed=5)
    again = serve_load.one_request(server.grpc_url, prompt, 24, temperature=1.0, top_p=0.9, random_seed=5)
    other = serve_load.one_request(server.grpc_url, prompt, 24, temperature=1.0, top_p=0.9, random_seed=6)
    assert first.complete and first.ids == again.ids and first.ids != other.ids
    stopped = serve_load.one_request(server.grpc_url, prompt, 24, stop_words=[first.text[3:5]])
    greedy = serve_load.one_request(server.grpc_url, prompt, 24)
    stop = first.text[3:5]
    if stop in greedy.text:
        assert stopped.finish == "stop" and stopped.text == greedy.text[: greedy.text.index(stop) + len(stop)]
    else:
        assert stopped.finish == "length" and stopped.ids == greedy.ids


def test_serve_bench_load_and_faults(capsys):
    """The acceptance check, through the CLI: N streams x M requests in flight with nothing lost,
    duplicated or mixed (each response equal to its prompt decoded alone), then a client that
    disconnects, bad requests, and a kill and restart under load. Exit 0 only if all of it holds."""
    code = main(["serve-bench", str(TINY_LM), "--clients", "3", "--requests", "3", "--max-tokens", str(MAX_TOKENS)])
    out = capsys.readouterr().out
    assert code == 0, out
    rows = {line.split("  ")[0].strip(): line.split() for line in out.splitlines()}
    under_load = rows["under load"]
    assert under_load[2:5] == ["3", "9", str(9 * MAX_TOKENS)] and under_load[-2:] == ["0", "0"]  # lost, wrong
    checks = [line for line in out.splitlines() if "  pass  " in line or "  FAIL  " in line]
    assert len(checks) == 10 and all("  pass  " in line for line in checks), out
    for name in (
        "disconnects mid-stream",
        "empty prompt",
        "over-long prompt",
        "negative max_tokens",
        "as FP32",
        "restarted under load",
        "HTTP generate_stream",
    ):
        assert any(name in line for line in checks), name


def test_a_repository_that_cannot_load_is_one_clear_error(tmp_path):
    write_lm_model(tmp_path / "repo", TINY_LM, name="broken")
    config = tmp_path / "repo" / "broken" / "config.pbtxt"
    config.write_text(config.read_text().replace('string_value: "ort"', 'string_value: "cuda-graphs"'))
    server = TritonServer(tmp_path / "repo", workdir=tmp_path, start_timeout_s=120)
    with pytest.raises(DeaMoEError, match="unknown runtime 'cuda-graphs'"):
        server.start()
    server.close()
    assert server.process.poll() is not None
