"""Write cpython-stdlib.txt from a CPython 3.11 standard library (see SOURCE.md beside this file).

    python make_cpython_stdlib.py /usr/lib/python3.11 cpython-stdlib.txt
    xz -9e cpython-stdlib.txt

Each module's source follows a line naming it, in the order of MODULES; the file ends with a
newline. Nothing of the sources is changed; a module that is not ASCII is refused.
"""

from __future__ import annotations

import sys
from pathlib import Path

MODULES = (
    "abc.py",
    "bisect.py",
    "copy.py",
    "fnmatch.py",
    "glob.py",
    "keyword.py",
    "textwrap.py",
    "string.py",
    "contextlib.py",
    "queue.py",
    "sched.py",
    "operator.py",
    "graphlib.py",
    "calendar.py",
    "csv.py",
    "pprint.py",
    "random.py",
    "json/__init__.py",
    "json/decoder.py",
    "json/encoder.py",
    "collections/__init__.py",
    "dataclasses.py",
    "difflib.py",
)


def main(lib: str, out: str) -> None:
    parts = []
    for name in MODULES:
        text = (Path(lib) / name).read_bytes().decode("ascii")
        parts.append(f"# ===== Lib/{name} =====\n{text}")
    Path(out).write_text("\n".join(parts).rstrip("\n") + "\n", encoding="ascii")


if __name__ == "__main__":
    main(*sys.argv[1:])
