"""Whether an outside package's version is in the range of minor releases deamoe-trt was tested with."""

from __future__ import annotations

from .errors import UsageError

# (lowest, highest) tested (major, minor), both included.
TestedRange = tuple[tuple[int, int], tuple[int, int]]


def tested_range(tested: TestedRange) -> str:
    """The range as people read it: "0.18.x", or "0.18.x to 0.19.x"."""
    (lo_major, lo_minor), (hi_major, hi_minor) = tested
    if (lo_major, lo_minor) == (hi_major, hi_minor):
        return f"{lo_major}.{lo_minor}.x"
    return f"{lo_major}.{lo_minor}.x to {hi_major}.{hi_minor}.x"


def check_tested(version: str, tested: TestedRange, package: str, tested_as: str, install: str) -> None:
    """A one-line UsageError unless version (package's __version__) is in tested.

    tested_as names what was tested with it ("deamoe-trt's vLLM plugin"); install is the command
    that gets a tested version."""
    try:
        major_minor = tuple(int(part) for part in version.split(".")[:2])
    except ValueError:
        raise UsageError(f"{package} reports version {version!r}, which deamoe-trt cannot read") from None
    if not tested[0] <= major_minor <= tested[1]:
        raise UsageError(
            f"{package} {version} is outside the versions {tested_as} was tested with "
            f"({tested_range(tested)}); install one of those: {install}"
        )
