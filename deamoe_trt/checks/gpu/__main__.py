"""python -m deamoe_trt.checks.gpu --out DIR: the same as `deamoe-trt check-gpu --out DIR`."""

import sys

from .cli import main

sys.exit(main())
