"""Where this package is imported from, and the source checkout it came from, if any.

A wheel carries everything the package runs, the kernel library's sources included
(deamoe_trt/cuda/_src). A checkout also holds what is built or made beside the package: the
TensorRT plugin's CMake project (plugins/) and its build folder, the Edge-LLM environment
scripts/setup.sh makes (.venv-edgellm), and, for an editable install, the kernel sources in
native/cuda. The checkout is $DEAMOE_TRT_CHECKOUT when set, else the folder an editable
install (`pip install -e .`) recorded in its direct_url.json (PEP 610); a wheel has none.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import json
import os
from pathlib import Path
from urllib.parse import unquote, urlparse

ENV_VAR = "DEAMOE_TRT_CHECKOUT"
DISTRIBUTION = "deamoe-trt"


def checkout_root() -> Path | None:
    """The source checkout: $DEAMOE_TRT_CHECKOUT, else an editable install's source folder, else None."""
    explicit = os.environ.get(ENV_VAR)
    if explicit:
        return Path(explicit).expanduser().resolve()
    return editable_source()


@functools.cache
def editable_source() -> Path | None:
    """The folder an editable install of deamoe-trt was made from (its direct_url.json), if it exists."""
    for dist in importlib.metadata.distributions(name=DISTRIBUTION):
        path = editable_folder(dist.read_text("direct_url.json"))
        if path is not None and path.is_dir():
            return path
    return None


def editable_folder(direct_url: str | None) -> Path | None:
    """The local folder a PEP 610 direct_url.json records for an editable install, else None."""
    try:
        record = json.loads(direct_url or "")
    except ValueError:
        return None
    if not isinstance(record, dict) or not (record.get("dir_info") or {}).get("editable"):
        return None
    url = urlparse(str(record.get("url", "")))
    if url.scheme != "file":
        return None
    return Path(unquote(url.path))


def import_root() -> Path:
    """The folder this process imports deamoe_trt from (site-packages or a checkout): what a
    child process needs on its path to import the same package."""
    spec = importlib.util.find_spec("deamoe_trt")
    assert spec is not None and spec.submodule_search_locations, "deamoe_trt is imported, so it has a spec"
    return Path(next(iter(spec.submodule_search_locations))).resolve().parent
