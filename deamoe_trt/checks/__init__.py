"""Device checks, run on a machine with a GPU (and TensorRT): `deamoe-trt check-gpu`
(deamoe_trt.checks.gpu: the CUDA kernels' correctness and speed) and `deamoe-trt check-trt`
(deamoe_trt.checks.trt_device: the TensorRT plugin end to end)."""
