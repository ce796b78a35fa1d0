"""The files libdeamoe_kernels.so is built from, relative to plugins/ (no imports: setup.py
reads this file to copy them into the wheel, and _library.py hashes them for its cache key).

The TensorRT plugin's files (deamoePlugin.*, plugin.cmake) are not among them: the binding
builds with DEAMOE_KERNELS_ONLY=ON."""

SOURCE_PATTERNS = ("CMakeLists.txt", "deamoe/deamoe*.h", "deamoe/deamoe*.cuh", "deamoe/deamoe*.cu")
EXCLUDED_PREFIX = "deamoe/deamoePlugin"

# Where a built (non-editable) package holds them, relative to deamoe_trt/cuda/.
PACKAGED_DIR = "_src"


def kernel_sources(root):
    """The kernel source files under root (a pathlib.Path laid out like plugins/), sorted."""
    return sorted(
        file
        for pattern in SOURCE_PATTERNS
        for file in root.glob(pattern)
        if not file.relative_to(root).as_posix().startswith(EXCLUDED_PREFIX)
    )
