"""checkpoint.py is the file format only: the layer builds on it, never the other way round."""

import subprocess
import sys
from pathlib import Path

import deamoe_trt

# The package's __init__ imports the layer, so load deamoe_trt.checkpoint under an empty
# package object with the same path: only what checkpoint.py itself imports gets loaded.
PROBE = """
import sys, types
package = types.ModuleType("deamoe_trt")
package.__path__ = [{path!r}]
sys.modules["deamoe_trt"] = package
import deamoe_trt.checkpoint
loaded = sorted(name for name in sys.modules if name.startswith("deamoe_trt."))
print(" ".join(loaded))
assert "deamoe_trt.layer" not in sys.modules, loaded
"""


def test_checkpoint_does_not_import_the_layer():
    path = str(Path(deamoe_trt.__file__).parent)
    result = subprocess.run([sys.executable, "-c", PROBE.format(path=path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "deamoe_trt.checkpoint" in result.stdout.split()  # the probe really loaded it
