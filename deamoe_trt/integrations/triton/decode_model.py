"""The LM decode service as a Triton Python-backend model (decoupled: tokens stream as they come).

`deamoe-trt triton-repo lm` writes <repo>/<name>/1/model.py, which only imports
`TritonPythonModel` from here, and the checkpoint beside it. This module runs inside Triton's
Python-backend stub (it imports triton_python_backend_utils, which only exists there).

Request (names and types as Triton's TensorRT-LLM and vLLM front ends use them; all but
text_input optional, each a one-element tensor, so Triton's /generate and /generate_stream
HTTP endpoints take them as plain JSON fields):

    text_input    BYTES   the prompt
    max_tokens    INT32   new tokens at most (default 64); the context may stop it earlier
    temperature   FP32    0 (default): greedy; > 0: sample
    top_p         FP32    nucleus sampling mass, (0, 1] (default 1)
    top_k         INT32   sample among the k most likely (default 0: all)
    random_seed   INT64   sampling seed (default 0)
    stop_words    BYTES   [n] strings; generation stops after producing any of them (kept in the output)
    stream        BOOL    true (default): responses as tokens come (one per token; with n > 4
                          sequences in flight up to ceil(n / 4) each); false: one response at the end

Responses: text_output BYTES [1] (the new text), token_ids INT32 [n] (the new ids),
finish_reason BYTES [1] ("" until the last response, then length / stop / context /
cancelled). The last response of a request carries Triton's final flag. A bad request
(empty or over-long prompt, max_tokens < 1, unknown character, bad sampling values) gets
one error response; a wrong datatype is rejected by Triton before it gets here.

Model parameters (config.pbtxt): checkpoint (folder, relative to the version folder),
runtime (ort | torch | cpu | trt), threads (CPU threads per instance), max_active (sequences
in flight, stepped together), engine and plugin (trt only).

Metrics (Prometheus, on Triton's metrics port next to its own): deamoe_lm_requests_total
{outcome}, deamoe_lm_tokens_total, deamoe_lm_active_sequences.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import triton_python_backend_utils as pb_utils

from ...errors import UsageError
from .scheduler import CANCELLED, ERROR, GenerationParams, Sequence, StepScheduler

FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


def _scalar(request, name: str, default):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return default
    values = tensor.as_numpy().reshape(-1)
    if values.size != 1:
        raise UsageError(f"{name} must hold one value, got {values.size}")
    value = values[0]
    return value.decode("utf-8", errors="strict") if isinstance(value, bytes) else value.item()


def _strings(request, name: str) -> tuple[str, ...]:
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    if tensor is None:
        return ()
    return tuple(v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in tensor.as_numpy().reshape(-1))


def read_request(request, encode) -> tuple[list[int], GenerationParams, bool]:
    """(prompt ids, params, stream) of a Triton request; UsageError naming what is wrong."""
    prompt = _scalar(request, "text_input", None)
    if prompt is None:
        raise UsageError("text_input is required")
    try:
        params = GenerationParams(
            max_tokens=int(_scalar(request, "max_tokens", 64)),
            temperature=float(_scalar(request, "temperature", 0.0)),
            top_p=float(_scalar(request, "top_p", 1.0)),
            top_k=int(_scalar(request, "top_k", 0)),
            seed=int(_scalar(request, "random_seed", 0)),
            stop=_strings(request, "stop_words"),
        )
    except (TypeError, ValueError, UnicodeDecodeError) as exc:
        raise UsageError(f"bad request parameter: {exc}") from None
    return encode(prompt), params, bool(_scalar(request, "stream", True))


def _response(ids: list[int], text: str, finish: str | None) -> pb_utils.InferenceResponse:
    return pb_utils.InferenceResponse(
        output_tensors=[
            pb_utils.Tensor("text_output", np.array([text.encode("utf-8")], dtype=np.object_)),
            pb_utils.Tensor("token_ids", np.asarray(ids, dtype=np.int32)),
            pb_utils.Tensor("finish_reason", np.array([(finish or "").encode()], dtype=np.object_)),
        ]
    )


def _error(message: str) -> pb_utils.InferenceResponse:
    return pb_utils.InferenceResponse(error=pb_utils.TritonError(message))


class TritonPythonModel:
    def initialize(self, args) -> None:
        import torch

        from ...lm.checkpoint import load_lm

        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        version_dir = Path(args["model_repository"]) / args["model_version"]
        threads = int(params.get("threads", "1"))
        torch.set_num_threads(threads)
        loaded = load_lm(version_dir / params.get("checkpoint", "checkpoint"))
        self.tokenizer = loaded.tokenizer
        runtime = params.get("runtime", "ort")
        max_active = int(params.get("max_active", "32"))
        batch = _batch_decoder(runtime, loaded.model, threads, max_active, version_dir, params)
        self._metrics()
        self.scheduler = StepScheduler(batch, self.tokenizer.decode, on_finish=self._finished).start()

    def _metrics(self) -> None:
        family = pb_utils.MetricFamily
        # Families must outlive their metrics: keep both on the model.
        self.families = {
            "requests": family("deamoe_lm_requests_total", "LM decode requests by outcome", family.COUNTER),
            "tokens": family("deamoe_lm_tokens_total", "tokens generated", family.COUNTER),
            "active": family("deamoe_lm_active_sequences", "sequences in flight", family.GAUGE),
        }
        self.outcomes: dict[str, Any] = {}  # outcome -> its Triton counter
        self.tokens = self.families["tokens"].Metric(labels={})
        self.active = self.families["active"].Metric(labels={})
        self.lock = threading.Lock()
        self.in_flight = 0

    def _count(self, outcome: str) -> None:
        metric = self.outcomes.get(outcome)
        if metric is None:
            metric = self.outcomes[outcome] = self.families["requests"].Metric(labels={"outcome": outcome})
        metric.increment(1)

    def _finished(self, sequence: Sequence, reason: str) -> None:
        with self.lock:
            self.in_flight -= 1
            self.active.set(self.in_flight)
            self.tokens.increment(len(sequence.new_ids))
            self._count(reason)

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            try:
                prompt_ids, params, stream = read_request(request, self.tokenizer.encode)
                sequence = Sequence(prompt_ids, params, _emitter(sender, stream), request.is_cancelled)
                with self.lock:
                    self.in_flight += 1
                    self.active.set(self.in_flight)
                try:
                    self.scheduler.submit(sequence)
                except Exception:
                    with self.lock:
                        self.in_flight -= 1
                        self.active.set(self.in_flight)
                    raise
            except UsageError as exc:
                with self.lock:
                    self._count("rejected")
                sender.send(_error(str(exc)), flags=FINAL)
            except Exception as exc:  # the client must get a final response whatever went wrong
                with self.lock:
                    self._count("error")
                sender.send(_error(f"internal error: {type(exc).__name__}: {exc}"), flags=FINAL)
        return None

    def finalize(self) -> None:
        self.scheduler.stop()


def _emitter(sender, stream: bool):
    """The scheduler's emit for one request: a response per emit, or one at the end."""
    held_ids: list[int] = []
    held_text: list[str] = []

    def emit(ids: list[int], text: str, finish: str | None, error: str | None) -> None:
        if finish in (ERROR, CANCELLED):
            sender.send(_error(error or "the request was cancelled"), flags=FINAL)
            return
        if stream:
            if ids or finish is None:
                sender.send(_response(ids, text, finish), flags=FINAL if finish else 0)
            else:
                sender.send(flags=FINAL)
            return
        held_ids.extend(ids)
        held_text.append(text)
        if finish is not None:
            sender.send(_response(held_ids, "".join(held_text), finish), flags=FINAL)

    return emit


def _batch_decoder(runtime: str, model, threads: int, max_active: int, version_dir: Path, params: dict):
    """The runtime's batch decoder for up to max_active sequences over one copy of the weights."""
    from ... import runtimes
    from .lm_runtimes import check_lm_runtime, needs_engine

    check_lm_runtime(runtime)
    options: dict = {}
    if needs_engine(runtime):
        options["engine"] = version_dir / params.get("engine", "model.engine")
        options["plugin"] = params.get("plugin") or os.environ.get("DEAMOE_TRT_PLUGIN")
    return runtimes.get(runtime).batch_decoder(model, max_sequences=max_active, threads=threads, **options)
