"""Serving on Triton Inference Server: model repositories, the LM decode service, a real tritonserver, load tests."""
