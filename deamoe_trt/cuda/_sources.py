"""The files libdeamoe_kernels.so is built from, relative to the kernel library's folder
(native/cuda/ of a checkout; no imports: setup.py reads this file to copy them into the wheel,
and _library.py hashes them for its cache key)."""

SOURCE_PATTERNS = ("CMakeLists.txt", "*.cmake", "deamoe*.h", "deamoe*.cuh", "deamoe*.cu")

# Where a built (non-editable) package holds them, relative to deamoe_trt/cuda/.
PACKAGED_DIR = "_src"


def kernel_sources(root):
    """The kernel source files under root (a pathlib.Path laid out like native/cuda/), sorted."""
    return sorted(file for pattern in SOURCE_PATTERNS for file in root.glob(pattern))
