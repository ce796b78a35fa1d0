"""A stand-in for the slice of the `tensorrt` Python API that deamoe_trt.trt uses.

It records what the build code asks for (network flags, builder flags, pools, profiles,
timing caches) so tests can check the TensorRT 10 / 11 differences without TensorRT.
Names and signatures follow TensorRT's Python bindings (python/src/infer/pyCore.cpp of
TensorRT 10.3 and 11.1); `make(version)` drops what that version does not have.
"""

from __future__ import annotations

import enum
import types


class DataType(enum.Enum):
    FLOAT = 0
    HALF = 1
    INT8 = 2
    INT32 = 3
    BF16 = 7


class NetworkDefinitionCreationFlag(enum.IntEnum):
    STRONGLY_TYPED = 1


class MemoryPoolType(enum.Enum):
    WORKSPACE = 0


class Logger:
    INTERNAL_ERROR, ERROR, WARNING, INFO, VERBOSE = range(5)

    def __init__(self, severity=WARNING):
        self.severity = severity


class FakeInput:
    def __init__(self, name, shape, dtype):
        self.name, self.shape, self.dtype = name, shape, dtype


class FakeNetwork:
    def __init__(self, flags):
        self.flags = flags
        self.inputs: list[FakeInput] = []

    @property
    def num_inputs(self):
        return len(self.inputs)

    def get_input(self, index):
        return self.inputs[index]


class ParserError:
    def __init__(self, text):
        self.text = text

    def __str__(self):
        return self.text


class OnnxParser:
    """Parses nothing: gives the network the inputs the test configured on the module."""

    def __init__(self, network, logger):
        self.network = network
        self.module = _current
        self.errors: list[str] = []

    def _apply(self):
        if self.module.parse_errors:
            self.errors = list(self.module.parse_errors)
            return False
        self.network.inputs = [FakeInput(*spec) for spec in self.module.network_inputs]
        return True

    def parse_from_file(self, path):
        self.module.parsed.append(("file", path, None))
        return self._apply()

    def parse(self, model, path=None):
        self.module.parsed.append(("bytes", path, bytes(model)))
        return self._apply()

    @property
    def num_errors(self):
        return len(self.errors)

    def get_error(self, index):
        return ParserError(self.errors[index])


class TimingCache:
    def __init__(self, data):
        self.data = bytes(data)

    def serialize(self):
        return self.data + b"+tuned"


class OptimizationProfile:
    def __init__(self):
        self.shapes = {}

    def set_shape(self, name, min, opt, max):
        self.shapes[name] = (tuple(min), tuple(opt), tuple(max))


class BuilderConfig:
    def __init__(self):
        self.pools = {}
        self.flags = set()
        self.builder_optimization_level = 3
        self.profiles = []
        self.cache = None
        self.progress_monitor = None

    def set_memory_pool_limit(self, pool, size):
        self.pools[pool] = size

    def set_flag(self, flag):
        self.flags.add(flag)

    def add_optimization_profile(self, profile):
        self.profiles.append(profile)
        return len(self.profiles) - 1

    def create_timing_cache(self, data):
        return TimingCache(data)

    def set_timing_cache(self, cache, ignore_mismatch):
        if cache.data.startswith(b"other-gpu"):
            return False
        self.cache = cache
        return True

    def get_timing_cache(self):
        return self.cache


class Builder:
    def __init__(self, logger):
        self.module = _current

    def create_network(self, flags=0):
        network = FakeNetwork(flags)
        self.module.networks.append(network)
        return network

    def create_builder_config(self):
        config = BuilderConfig()
        self.module.configs.append(config)
        return config

    def create_optimization_profile(self):
        return OptimizationProfile()

    def build_serialized_network(self, network, config):
        monitor = config.progress_monitor
        if monitor is not None:
            monitor.phase_start("Building engine", None, 2)
            monitor.phase_start("Tactic selection", "Building engine", 3)
            for step in range(3):
                if not monitor.step_complete("Tactic selection", step):
                    return None
            monitor.phase_finish("Tactic selection")
            monitor.phase_finish("Building engine")
        if self.module.build_fails:
            return None
        return b"ENGINE:" + repr(sorted(str(f) for f in config.flags)).encode()


class IProgressMonitor:
    def __init__(self):
        pass


class Registry:
    def __init__(self):
        self.creators = {}
        self.libraries = []

    def get_creator(self, name, version, namespace=""):
        return self.creators.get((name, version, namespace))

    def load_library(self, path):
        self.libraries.append(path)
        return object()


_current = None


def make(version: str = "10.3.0", **settings):
    """A fake `tensorrt` module of the given version.

    settings: network_inputs [(name, shape, DataType)], parse_errors [str], build_fails,
    progress (whether IProgressMonitor exists).
    """
    global _current
    module = types.ModuleType("tensorrt")
    module.__version__ = version
    module.__file__ = "/fake/tensorrt/__init__.py"
    major = int(version.split(".")[0])
    flags = {"DEBUG": 2, "TF32": 6}
    if major < 11:  # TensorRT 11 removed the weak-typing precision flags
        flags.update(FP16=0, INT8=1, BF16=17)
    module.BuilderFlag = enum.Enum("BuilderFlag", flags)
    for name in ("DataType", "NetworkDefinitionCreationFlag", "MemoryPoolType", "Logger", "Builder", "OnnxParser"):
        setattr(module, name, globals()[name])
    if settings.pop("progress", True):
        module.IProgressMonitor = IProgressMonitor
    module.network_inputs = settings.pop("network_inputs", [("hidden_states", (-1, 64), DataType.HALF)])
    module.parse_errors = settings.pop("parse_errors", [])
    module.build_fails = settings.pop("build_fails", False)
    if settings:
        raise TypeError(f"unknown settings {sorted(settings)}")
    module.parsed, module.networks, module.configs = [], [], []
    module.registry = Registry()
    module.get_plugin_registry = lambda: module.registry
    _current = module
    return module
