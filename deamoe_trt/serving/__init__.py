"""The old import path of the Triton LM decode service, kept for one release.

Model repositories that an earlier release's `deamoe-trt triton-repo lm` wrote hold a model.py
importing `deamoe_trt.serving.decode_model` (the service now lives in deamoe_trt.integrations.triton);
this alias keeps them loading (the rest of such a repository reads as a new one does).
Rerunning `deamoe-trt triton-repo` writes the new path; the next release removes this package.
"""
