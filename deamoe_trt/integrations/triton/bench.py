"""Load and faults against the LM decode service on a running tritonserver (loopback only).

Clients are tritonclient's: gRPC bidirectional streams (one per client, its requests in
flight together and told apart by request id) and, for HTTP, Triton's generate_stream
endpoint (server-sent events). Every greedy response is compared with the same prompt
decoded alone, in this process, on the same runtime: a lost request (no final response),
a duplicated token, or tokens of another request all show up as a mismatch.

What is measured (client side, wall clock, so it includes gRPC and the Python backend):
latency (request sent -> final response), TTFT (-> first token), TPOT (mean gap between
tokens of one request), tokens/s (all tokens of a run / its wall time). The machine this
ran on was shared, so absolute numbers are noisy; the ratio of TPOT under load to TPOT
alone, measured in the same run, is the number to compare.
"""

from __future__ import annotations

import json
import statistics
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...console import format_table
from ...errors import DeaMoEError, MissingDependencyError
from ...lm.shipped import read_prompts

MODEL = "tiny_lm"

# The default prompts: different lengths, so caches differ in length.
PROMPTS = tuple(read_prompts())


def _grpc():
    try:
        import tritonclient.grpc as grpcclient
    except ImportError:
        raise MissingDependencyError(
            "the load test needs tritonclient: pip install 'tritonclient[grpc,http]'"
        ) from None
    return grpcclient


@dataclass
class Outcome:
    """One request as the client saw it."""

    request_id: str
    prompt: str
    ids: list[int] = field(default_factory=list)
    text: str = ""
    finish: str = ""
    error: str | None = None
    sent_s: float = 0.0
    arrivals_s: list[float] = field(default_factory=list)  # one per token-carrying response
    arrival_tokens: list[int] = field(default_factory=list)  # the tokens each of them carried
    done_s: float | None = None
    foreign: int = 0  # responses carrying another request's id (mixed-up streams)

    @property
    def complete(self) -> bool:
        return self.done_s is not None and self.error is None

    @property
    def latency_s(self) -> float | None:
        return self.done_s - self.sent_s if self.done_s is not None else None

    @property
    def ttft_s(self) -> float | None:
        return self.arrivals_s[0] - self.sent_s if self.arrivals_s else None

    @property
    def gaps_s(self) -> list[float]:
        """Time per output token after the first: a response's gap spread over its tokens."""
        pairs = zip(self.arrivals_s, self.arrivals_s[1:], self.arrival_tokens[1:], strict=False)
        return [(b - a) / n for a, b, n in pairs for _ in range(n)]


def _inputs(grpcclient, prompt: str, max_tokens: int, params: dict) -> list:
    def tensor(name, array, datatype):
        t = grpcclient.InferInput(name, list(array.shape), datatype)
        t.set_data_from_numpy(array)
        return t

    inputs = [
        tensor("text_input", np.array([prompt.encode()], dtype=np.object_), "BYTES"),
        tensor("max_tokens", np.array([max_tokens], dtype=np.int32), "INT32"),
    ]
    kinds = {
        "temperature": (np.float32, "FP32"),
        "top_p": (np.float32, "FP32"),
        "top_k": (np.int32, "INT32"),
        "random_seed": (np.int64, "INT64"),
    }
    for name, value in params.items():
        if name == "stop_words":
            inputs.append(tensor(name, np.array([s.encode() for s in value], dtype=np.object_), "BYTES"))
        elif name in kinds:
            dtype, datatype = kinds[name]
            inputs.append(tensor(name, np.array([value], dtype=dtype), datatype))
        else:
            raise DeaMoEError(f"unknown generation parameter {name!r}")
    return inputs


class StreamClient:
    """One gRPC stream to the decode service; requests on it run concurrently, matched by id."""

    def __init__(self, url: str, model: str = MODEL):
        self.grpcclient = _grpc()
        self.client = self.grpcclient.InferenceServerClient(url)
        self.model = model
        self.outcomes: dict[str, Outcome] = {}
        self.stream_errors: list[str] = []
        self.lock = threading.Lock()
        self.finished = threading.Condition(self.lock)
        self.client.start_stream(callback=self._on_response)

    def _on_response(self, result, error) -> None:
        now = time.perf_counter()
        with self.lock:
            if error is not None:
                # tritonclient drops the request id of an error response; with one request
                # in flight (how the fault checks send them) it is that one.
                pending = [o for o in self.outcomes.values() if o.done_s is None]
                if len(pending) == 1:
                    pending[0].error, pending[0].done_s = str(error), now
                else:
                    self.stream_errors.append(str(error))
                self.finished.notify_all()
                return
            response = result.get_response()
            outcome = self.outcomes.get(response.id)
            if outcome is None or outcome.done_s is not None:
                for other in self.outcomes.values():
                    other.foreign += other.done_s is None
                return
            ids = result.as_numpy("token_ids")
            if ids is not None and ids.size:
                outcome.ids.extend(int(i) for i in ids)
                outcome.text += result.as_numpy("text_output")[0].decode()
                outcome.arrivals_s.append(now)
                outcome.arrival_tokens.append(int(ids.size))
            final = response.parameters.get("triton_final_response")
            if final is not None and final.bool_param:
                finish = result.as_numpy("finish_reason")
                outcome.finish = finish[0].decode() if finish is not None else ""
                outcome.done_s = now
                self.finished.notify_all()

    def submit(self, request_id: str, prompt: str, max_tokens: int, *, inputs=None, **params) -> Outcome:
        """Send a request (inputs: raw tritonclient inputs instead of prompt, max_tokens and params)."""
        outcome = Outcome(request_id, prompt)
        with self.lock:
            self.outcomes[request_id] = outcome
            outcome.sent_s = time.perf_counter()
        self.client.async_stream_infer(
            self.model,
            inputs or _inputs(self.grpcclient, prompt, max_tokens, params),
            request_id=request_id,
            enable_empty_final_response=True,
        )
        return outcome

    def wait(self, timeout_s: float) -> bool:
        """True once every submitted request has its final response (or error), False at the timeout."""
        deadline = time.monotonic() + timeout_s
        with self.lock:
            while any(o.done_s is None for o in self.outcomes.values()):
                left = deadline - time.monotonic()
                if left <= 0 or self.stream_errors:
                    return False
                self.finished.wait(left)
        return True

    def close(self, *, cancel: bool = False) -> None:
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()


def generate_over_http(
    http_url: str, prompt: str, max_tokens: int, model: str = MODEL, timeout_s: float = 60
) -> Outcome:
    """One request through Triton's HTTP generate_stream endpoint (server-sent events)."""
    outcome = Outcome("http", prompt, sent_s=time.perf_counter())
    body = json.dumps({"text_input": prompt, "max_tokens": max_tokens}).encode()
    request = urllib.request.Request(f"http://{http_url}/v2/models/{model}/generate_stream", data=body)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as reply:
            for raw in reply:
                line = raw.decode().strip()
                if not line.startswith("data:"):
                    continue
                event = json.loads(line[len("data:") :])
                if "error" in event:
                    outcome.error = event["error"]
                    break
                ids = event.get("token_ids", [])
                outcome.ids.extend([ids] if isinstance(ids, int) else ids)
                outcome.text += event.get("text_output", "")
                outcome.arrivals_s.append(time.perf_counter())
                outcome.arrival_tokens.append(1 if isinstance(ids, int) else len(ids))
                outcome.finish = event.get("finish_reason", "")
    except urllib.error.HTTPError as exc:
        outcome.error = exc.read().decode(errors="replace")
    outcome.done_s = time.perf_counter()
    return outcome


# Load ------------------------------------------------------------------------------------


@dataclass
class LoadResult:
    label: str
    clients: int
    requests: int
    outcomes: list[Outcome]
    wall_s: float
    expected: dict[str, list[int]]

    @property
    def tokens(self) -> int:
        return sum(len(o.ids) for o in self.outcomes)

    @property
    def lost(self) -> int:
        return sum(not o.complete for o in self.outcomes)

    @property
    def wrong(self) -> int:
        """Complete responses whose tokens differ from the prompt decoded alone (duplicated, missing or mixed)."""
        return sum(o.complete and (o.ids != self.expected[o.prompt] or o.foreign > 0) for o in self.outcomes)

    def percentile(self, values: list[float], q: float) -> float:
        return float(np.percentile(values, q)) if values else float("nan")

    def row(self, tpot_alone_s: float | None) -> tuple:
        latencies = [o.latency_s for o in self.outcomes if o.complete]
        gaps = [g for o in self.outcomes if o.complete for g in o.gaps_s]
        ttfts = [o.ttft_s for o in self.outcomes if o.ttft_s is not None]
        tpot = statistics.fmean(gaps) if gaps else float("nan")
        ratio = f"{tpot / tpot_alone_s:.2f}" if tpot_alone_s else "1.00"
        return (
            self.label,
            self.clients,
            self.clients * self.requests,
            self.tokens,
            f"{self.tokens / self.wall_s:.0f}",
            f"{self.percentile(latencies, 50) * 1e3:.0f}",
            f"{self.percentile(latencies, 99) * 1e3:.0f}",
            f"{statistics.median(ttfts) * 1e3:.1f}" if ttfts else "n/a",
            f"{tpot * 1e3:.2f}",
            ratio,
            self.lost,
            self.wrong,
        )


LOAD_HEADERS = (
    "run",
    "clients",
    "requests",
    "tokens",
    "tokens/s",
    "p50 ms",
    "p99 ms",
    "TTFT p50 ms",
    "TPOT ms",
    "TPOT / alone",
    "lost",
    "wrong",
)


def expected_outputs(
    checkpoint: Path, prompts: list[str], max_tokens: int, runtime: str = "ort"
) -> dict[str, list[int]]:
    """Each prompt decoded alone, greedy, in this process on the service's runtime: what the server must return."""
    from ... import runtimes
    from ...lm.checkpoint import load_lm
    from ...runtimes.decode import generate

    loaded = load_lm(checkpoint)
    decoder = runtimes.get(runtime).decoder(loaded.model, threads=1)
    return {p: generate(decoder, loaded.tokenizer.encode(p), max_tokens).new_ids for p in dict.fromkeys(prompts)}


def run_load(
    grpc_url: str,
    *,
    clients: int,
    requests: int,
    max_tokens: int,
    expected: dict[str, list[int]],
    label: str,
    timeout_s: float = 120,
) -> LoadResult:
    """clients streams at once, each with `requests` requests in flight together; prompts rotate."""
    prompts = list(expected)
    streams = [StreamClient(grpc_url) for _ in range(clients)]
    start = time.perf_counter()
    try:
        for i, stream in enumerate(streams):
            for j in range(requests):
                stream.submit(f"c{i}-r{j}", prompts[(i * requests + j) % len(prompts)], max_tokens)
        deadline = time.monotonic() + timeout_s
        for stream in streams:
            stream.wait(max(0.0, deadline - time.monotonic()))
        wall = time.perf_counter() - start
    finally:
        for stream in streams:
            stream.close(cancel=True)
    outcomes = [o for s in streams for o in s.outcomes.values()]
    return LoadResult(label, clients, requests, outcomes, wall, expected)


def load_table(results: list[LoadResult]) -> str:
    alone = next((r for r in results if r.clients == 1 and r.requests == 1), None)
    tpot_alone = None
    if alone is not None:
        gaps = [g for o in alone.outcomes if o.complete for g in o.gaps_s]
        tpot_alone = statistics.fmean(gaps) if gaps else None
    rows = [r.row(tpot_alone if r is not alone else None) for r in results]
    return format_table(
        LOAD_HEADERS,
        rows,
        title="LM decode service on tritonserver (gRPC streams, greedy; wrong: differs from the prompt decoded alone)",
    )


# Faults ----------------------------------------------------------------------------------


@dataclass
class FaultCheck:
    name: str
    passed: bool
    detail: str


def metric_value(metrics_url: str, name: str, labels: str = "") -> float:
    """A Prometheus sample from Triton's metrics endpoint (0 if absent)."""
    with urllib.request.urlopen(metrics_url, timeout=5) as reply:
        text = reply.read().decode()
    key = f"{name}{{{labels}}}" if labels else name
    for line in text.splitlines():
        if line.startswith(key + " "):
            return float(line.split()[-1])
    return 0.0


def one_request(grpc_url: str, prompt: str, max_tokens: int, timeout_s: float = 60, **params) -> Outcome:
    stream = StreamClient(grpc_url)
    try:
        outcome = stream.submit("one", prompt, max_tokens, **params)
        if not stream.wait(timeout_s) and stream.stream_errors:
            outcome.error = stream.stream_errors[0]
        return outcome
    finally:
        stream.close()


def check_disconnect(
    grpc_url: str, metrics_url: str, expected: dict[str, list[int]], *, requests: int = 8, timeout_s: float = 60
) -> FaultCheck:
    """A client with `requests` long requests in flight goes away after its first tokens: the
    server cancels what is left (the cancelled count rises, fewer tokens than asked for are
    generated, nothing stays active) and keeps serving others. Several requests, so that the work
    left when the client goes is far longer than Triton takes to notice, even on a busy machine."""
    asked = 250  # the tiny LM's context is 256
    requests_metric = "deamoe_lm_requests_total"
    cancelled_before = metric_value(metrics_url, requests_metric, 'outcome="cancelled"')
    tokens_before = metric_value(metrics_url, "deamoe_lm_tokens_total")
    stream = StreamClient(grpc_url)
    outcomes = [stream.submit(f"long-{i}", "Anne", asked) for i in range(requests)]
    deadline = time.monotonic() + timeout_s
    while sum(len(o.ids) for o in outcomes) < 3 and time.monotonic() < deadline:
        time.sleep(0.002)
    got = sum(len(o.ids) for o in outcomes)
    stream.close(cancel=True)
    cancelled = active = generated = 0.0
    while time.monotonic() < deadline:
        active = metric_value(metrics_url, "deamoe_lm_active_sequences")
        if active == 0:
            break
        time.sleep(0.1)
    cancelled = metric_value(metrics_url, requests_metric, 'outcome="cancelled"') - cancelled_before
    generated = metric_value(metrics_url, "deamoe_lm_tokens_total") - tokens_before
    prompt = next(iter(expected))
    after = one_request(grpc_url, prompt, len(expected[prompt]))
    correct = after.complete and after.ids == expected[prompt]
    passed = cancelled >= 1 and generated < requests * asked and active == 0 and correct
    return FaultCheck(
        "client disconnects mid-stream",
        passed,
        f"left after {got} tokens of {requests} x {asked}; server cancelled {cancelled:.0f}, generated "
        f"{generated:.0f} tokens, active {active:.0f}; next request {'correct' if correct else 'WRONG'}",
    )


def check_bad_requests(grpc_url: str, expected: dict[str, list[int]], max_context: int) -> list[FaultCheck]:
    """Each bad request gets an error response; a good one right after is still served correctly."""
    grpcclient = _grpc()
    checks = []
    cases = {
        "empty prompt": ("", 8, {}),
        f"over-long prompt ({max_context + 10} tokens)": ("a" * (max_context + 10), 8, {}),
        "negative max_tokens": ("Anne", -3, {}),
        "top_p out of range": ("Anne", 8, {"top_p": 1.5}),
        "character outside the tokenizer": ("Anne\u2019s", 8, {}),
    }
    for name, (prompt, max_tokens, params) in cases.items():
        outcome = one_request(grpc_url, prompt, max_tokens, **params)
        checks.append(FaultCheck(f"bad request: {name}", outcome.error is not None, _short(outcome.error)))
    # Wrong datatype: max_tokens as FP32; Triton itself rejects it against the model config.
    text = grpcclient.InferInput("text_input", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"Anne"], dtype=np.object_))
    tokens = grpcclient.InferInput("max_tokens", [1], "FP32")
    tokens.set_data_from_numpy(np.array([8.0], dtype=np.float32))
    stream = StreamClient(grpc_url)
    try:
        wrong = stream.submit("wrong-dtype", "Anne", 8, inputs=[text, tokens])
        stream.wait(30)
    finally:
        stream.close()
    checks.append(FaultCheck("bad request: max_tokens as FP32", wrong.error is not None, _short(wrong.error)))
    prompt = next(iter(expected))
    after = one_request(grpc_url, prompt, len(expected[prompt]))
    checks.append(
        FaultCheck(
            "good request after the bad ones",
            after.complete and after.ids == expected[prompt],
            f"{len(after.ids)} tokens, {_same(after.ids, expected[prompt])} alone",
        )
    )
    return checks


def check_restart(
    server, expected: dict[str, list[int]], *, clients: int = 3, max_tokens: int | None = None
) -> FaultCheck:
    """Clients keep sending while the server is killed and started again on the same ports:
    they see errors while it is down, then get correct responses again."""
    prompts = list(expected)
    max_tokens = max_tokens or len(expected[prompts[0]])
    stop = threading.Event()
    errors = [0] * clients
    good_after = [0] * clients
    wrong = [0] * clients
    restarted = threading.Event()

    def client(i: int) -> None:
        while not stop.is_set():
            prompt = prompts[i % len(prompts)]
            try:
                outcome = one_request(server.grpc_url, prompt, max_tokens, timeout_s=20)
                ok = outcome.complete
            except Exception:
                ok = False
            if not ok:
                errors[i] += 1
                time.sleep(0.1)
            elif outcome.ids != expected[prompt][: len(outcome.ids)] or len(outcome.ids) != max_tokens:
                wrong[i] += 1
            elif restarted.is_set():
                good_after[i] += 1
                if good_after[i] >= 2:
                    return

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for t in threads:
        t.start()
    time.sleep(1.0)  # under load before the crash
    server.restart(kill=True)
    restarted.set()
    deadline = time.monotonic() + 60
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    stop.set()
    passed = sum(errors) > 0 and all(g >= 2 for g in good_after) and sum(wrong) == 0
    return FaultCheck(
        "server killed and restarted under load",
        passed,
        f"{clients} clients saw {sum(errors)} errors while it was down, then {sum(good_after)} correct responses; "
        f"{sum(wrong)} wrong",
    )


def _same(ids: list[int], expected: list[int]) -> str:
    return "equal to" if ids == expected else "DIFFERENT from"


def _short(text: str | None) -> str:
    if text is None:
        return "NO ERROR (served)"
    return " ".join(text.split())[:110]


def fault_table(checks: list[FaultCheck]) -> str:
    return format_table(
        ("check", "result", "what happened"),
        [(c.name, "pass" if c.passed else "FAIL", c.detail) for c in checks],
        title="Faults",
        align="lll",
    )


# The whole bench ---------------------------------------------------------------------------


@dataclass
class BenchResult:
    loads: list[LoadResult]
    checks: list[FaultCheck]
    server_start_s: float

    @property
    def ok(self) -> bool:
        return all(r.lost == 0 and r.wrong == 0 for r in self.loads) and all(c.passed for c in self.checks)


def run_bench(
    checkpoint: Path,
    *,
    prompts: list[str] | None = None,
    runtime: str = "ort",
    clients: int = 4,
    requests: int = 4,
    max_tokens: int = 32,
    alone_runs: int = 3,
    faults: bool = True,
    log=print,
) -> BenchResult:
    """Write a repository with the decode service, start tritonserver on loopback, measure
    one request alone, then clients x requests at once, then alone again (so drift shows in both
    directions), then an HTTP request and the fault checks; stop the server. prompts default
    to PROMPTS; they rotate over the requests."""
    import tempfile

    from ...lm.checkpoint import load_lm
    from .repo import write_lm_model
    from .server import TritonServer

    checkpoint = Path(checkpoint)
    max_context = load_lm(checkpoint).model.config.max_position_embeddings
    prompts = list(PROMPTS if prompts is None else prompts)
    log(f"decoding {len(prompts)} prompts alone in this process ({runtime}) for the expected outputs")
    expected = expected_outputs(checkpoint, prompts, max_tokens, runtime)
    with tempfile.TemporaryDirectory(prefix="deamoe-serve-bench-") as tmp:
        repo = Path(tmp) / "repo"
        write_lm_model(repo, checkpoint, name=MODEL, runtime=runtime, max_active=max(32, clients * requests))
        server = TritonServer(repo, workdir=Path(tmp))
        start = time.perf_counter()
        server.start()
        started = time.perf_counter() - start
        log(f"tritonserver ready in {started:.1f} s (HTTP {server.http_url}, gRPC {server.grpc_url})")
        try:
            one_request(server.grpc_url, prompts[0], 4)  # warm-up: first-call costs stay out of the numbers

            def one_at_a_time() -> list[LoadResult]:
                return [
                    run_load(
                        server.grpc_url,
                        clients=1,
                        requests=1,
                        max_tokens=max_tokens,
                        expected={p: expected[p]},
                        label="alone",
                    )
                    for p in prompts[:alone_runs]
                ]

            alone = one_at_a_time()
            log(f"load: {clients} clients x {requests} requests in flight, {max_tokens} tokens each")
            loaded = run_load(
                server.grpc_url,
                clients=clients,
                requests=requests,
                max_tokens=max_tokens,
                expected=expected,
                label="under load",
            )
            alone += one_at_a_time()
            merged = LoadResult(
                "alone", 1, 1, [o for r in alone for o in r.outcomes], sum(r.wall_s for r in alone), expected
            )
            checks = []
            http = generate_over_http(server.http_url, prompts[1], max_tokens)
            checks.append(
                FaultCheck(
                    "HTTP generate_stream",
                    http.error is None and http.ids == expected[prompts[1]],
                    f"{len(http.ids)} tokens, {_same(http.ids, expected[prompts[1]])} alone",
                )
            )
            if faults:
                log("faults: disconnect, bad requests, restart under load")
                checks.append(check_disconnect(server.grpc_url, server.metrics_url, expected))
                checks += check_bad_requests(server.grpc_url, expected, max_context)
                checks.append(check_restart(server, expected, max_tokens=max_tokens))
        except BaseException:
            log(f"tritonserver log tail: {server.last_error()}")
            raise
        finally:
            server.close()
    return BenchResult([merged, loaded], checks, started)
