"""A stand-in for the part of TensorRT's runtime API the executor uses, running the bundle's own ONNX graphs.

A stand-in "plan" carries its graph's ONNX bytes and the optimization profile the real builder would use
(medgemma_xray.engine_build.builder.graph_profiles). The engine reports I/O names, modes, types, shapes (-1 where dynamic) and
profile ranges from the graph; the context enforces the profile in set_input_shape, resolves output shapes from
the inputs' symbolic dimensions, and in execute_async_v3 requires every input shape and every I/O address, waits for
the stream, reads each input from "device" memory (bounds-checked by the memory object; NaN in a float input
means it read memory nothing wrote), runs ONNX Runtime, and writes each output back. Failures return False and
log through the ILogger, as TensorRT does. What it cannot stand in for: TensorRT's kernels and its fusions.
"""

from __future__ import annotations

import enum
import io
import json
import types

import numpy as np

PLAN_MAGIC = b"ORT-STANDIN-PLAN\n"
STANDIN_VERSION = "standin-onnxruntime-1"


class _Severity(enum.IntEnum):
    INTERNAL_ERROR = 0
    ERROR = 1
    WARNING = 2
    INFO = 3
    VERBOSE = 4


class ILogger:
    Severity = _Severity

    def __init__(self) -> None:
        pass

    def log(self, severity, message) -> None:  # overridden by the executor's logger
        pass


class TensorIOMode(enum.Enum):
    NONE = 0
    INPUT = 1
    OUTPUT = 2


class DataType(enum.Enum):
    FLOAT = 0
    HALF = 1
    INT8 = 2
    INT32 = 3
    BOOL = 4
    BF16 = 7
    INT64 = 8


ONNX_TYPES = {
    1: (DataType.FLOAT, np.float32),
    10: (DataType.HALF, np.float16),
    7: (DataType.INT64, np.int64),
    6: (DataType.INT32, np.int32),
    9: (DataType.BOOL, np.bool_),
}


def encode_plan(graph: str, profile: dict, onnx_bytes: bytes) -> bytes:
    header = json.dumps({"graph": graph, "profile": {k: [list(s) for s in v] for k, v in profile.items()}})
    return PLAN_MAGIC + header.encode() + b"\n" + onnx_bytes


class _Tensor:
    def __init__(self, value_info, mode: TensorIOMode) -> None:
        tensor_type = value_info.type.tensor_type
        self.name, self.mode = value_info.name, mode
        self.dtype, self.numpy = ONNX_TYPES[tensor_type.elem_type]
        self.dims = [
            (d.dim_param or None) if not d.HasField("dim_value") else int(d.dim_value) for d in tensor_type.shape.dim
        ]

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(d if isinstance(d, int) else -1 for d in self.dims)


class ICudaEngine:
    def __init__(self, graph: str, profile: dict, onnx_bytes: bytes, memory, logger) -> None:
        import onnx
        import onnxruntime as ort

        model = onnx.load_model(io.BytesIO(onnx_bytes))
        self.graph, self.memory, self.logger = graph, memory, logger
        self.profile = {name: [tuple(s) for s in shapes] for name, shapes in profile.items()}
        initializers = {init.name for init in model.graph.initializer}
        inputs = [_Tensor(v, TensorIOMode.INPUT) for v in model.graph.input if v.name not in initializers]
        outputs = [_Tensor(v, TensorIOMode.OUTPUT) for v in model.graph.output]
        self.tensors = {t.name: t for t in inputs + outputs}
        self.order = [t.name for t in inputs + outputs]
        for tensor in inputs:
            if tensor.shape.count(-1) and tensor.name not in self.profile:
                raise ValueError(f"dynamic input {tensor.name} has no optimization profile")
        self._inferred: dict = {}
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        self.session = ort.InferenceSession(onnx_bytes, options, providers=["CPUExecutionProvider"])

    def inferred_output_shape(self, name: str, input_shapes: dict) -> tuple[int, ...]:
        """Output shapes the graph computes (not named after an input dimension): one zero-input run per input-shape
        signature, cached."""
        key = tuple(sorted(input_shapes.items()))
        if key not in self._inferred:
            feeds = {n: np.zeros(shape, dtype=self.tensors[n].numpy) for n, shape in input_shapes.items()}
            outputs = self.session.run(None, feeds)
            self._inferred[key] = {
                o.name: tuple(v.shape) for o, v in zip(self.session.get_outputs(), outputs, strict=True)
            }
        return self._inferred[key][name]

    @property
    def num_io_tensors(self) -> int:
        return len(self.order)

    @property
    def num_optimization_profiles(self) -> int:
        return 1

    def get_tensor_name(self, index: int) -> str:
        return self.order[index]

    def get_tensor_mode(self, name: str) -> TensorIOMode:
        return self.tensors[name].mode if name in self.tensors else TensorIOMode.NONE

    def get_tensor_dtype(self, name: str) -> DataType:
        return self.tensors[name].dtype

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        return self.tensors[name].shape

    def get_tensor_profile_shape(self, name: str, profile_index: int) -> list[tuple[int, ...]]:
        if profile_index != 0 or name not in self.profile:
            raise ValueError(f"no profile {profile_index} for {name}")
        return self.profile[name]

    def create_execution_context(self) -> IExecutionContext:
        return IExecutionContext(self)


class IExecutionContext:
    def __init__(self, engine: ICudaEngine) -> None:
        self.engine = engine
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.addresses: dict[str, int] = {}
        self.executions = 0

    def _error(self, message: str) -> bool:
        self.engine.logger.log(_Severity.ERROR, f"[standin {self.engine.graph}] {message}")
        return False

    def set_input_shape(self, name: str, shape) -> bool:
        tensor = self.engine.tensors.get(name)
        shape = tuple(int(d) for d in shape)
        if tensor is None or tensor.mode != TensorIOMode.INPUT:
            return self._error(f"set_input_shape: {name} is not an input")
        if len(shape) != len(tensor.dims) or any(
            isinstance(d, int) and d != s for d, s in zip(tensor.dims, shape, strict=False)
        ):
            return self._error(f"set_input_shape: {shape} does not fit {tensor.shape} for {name}")
        if name in self.engine.profile:
            low, _, high = self.engine.profile[name]
            if any(s < lo or s > hi for s, lo, hi in zip(shape, low, high, strict=True)):
                return self._error(f"set_input_shape: {shape} for {name} is outside the profile [{low}, {high}]")
        self.shapes[name] = shape
        return True

    def _symbols(self) -> dict[str, int]:
        symbols: dict[str, int] = {}
        for name, shape in self.shapes.items():
            for dim, value in zip(self.engine.tensors[name].dims, shape, strict=True):
                if isinstance(dim, str):
                    symbols.setdefault(dim, value)
        return symbols

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        tensor = self.engine.tensors[name]
        if tensor.mode == TensorIOMode.INPUT:
            return self.shapes.get(name, tensor.shape)
        symbols = self._symbols()
        shape = tuple(d if isinstance(d, int) else symbols.get(d, -1) for d in tensor.dims)
        if -1 in shape and len(self.shapes) == sum(t.mode == TensorIOMode.INPUT for t in self.engine.tensors.values()):
            shape = self.engine.inferred_output_shape(name, self.shapes)  # computed dims, as TensorRT's shape machine
        return shape

    def set_tensor_address(self, name: str, address: int) -> bool:
        if name not in self.engine.tensors:
            return self._error(f"set_tensor_address: no tensor named {name}")
        if not address:
            return self._error(f"set_tensor_address: null address for {name}")
        self.addresses[name] = int(address)
        return True

    def get_tensor_address(self, name: str) -> int:
        return self.addresses.get(name, 0)

    def execute_async_v3(self, stream_handle: int) -> bool:
        engine = self.engine
        for name, tensor in engine.tensors.items():
            if tensor.mode == TensorIOMode.INPUT and name not in self.shapes and -1 in tensor.shape:
                return self._error(f"execute_async_v3: the shape of input {name} was never set")
            if name not in self.addresses:
                return self._error(f"execute_async_v3: the address of {name} was never set")
        try:
            engine.memory.synchronize(stream_handle)  # stream order: the inputs' copies land first
            feeds = {}
            for name, tensor in engine.tensors.items():
                if tensor.mode != TensorIOMode.INPUT:
                    continue
                shape = self.get_tensor_shape(name)
                nbytes = int(np.prod(shape)) * np.dtype(tensor.numpy).itemsize
                value = np.frombuffer(engine.memory.read(self.addresses[name], nbytes), dtype=tensor.numpy)
                value = value.reshape(shape)
                if value.dtype.kind == "f" and np.isnan(value).any():
                    return self._error(f"execute_async_v3: {name} holds NaN: it was read from memory nothing wrote")
                feeds[name] = value
            results = engine.session.run(None, feeds)
            for output, value in zip(engine.session.get_outputs(), results, strict=True):
                expected = self.get_tensor_shape(output.name)
                if tuple(value.shape) != expected:
                    return self._error(f"execute_async_v3: {output.name} came out {value.shape}, expected {expected}")
                engine.memory.write(self.addresses[output.name], np.ascontiguousarray(value).tobytes())
        except Exception as exc:  # an out-of-bounds access or a graph that refused its inputs: fail, as TensorRT does
            return self._error(f"execute_async_v3: {type(exc).__name__}: {exc}")
        self.executions += 1
        return True


class Runtime:
    def __init__(self, logger, memory) -> None:
        self.logger, self.memory = logger, memory

    def deserialize_cuda_engine(self, data: bytes):
        if not data.startswith(PLAN_MAGIC):
            self.logger.log(_Severity.ERROR, "deserialize_cuda_engine: not a stand-in plan (a real TensorRT plan?)")
            return None
        header, _, onnx_bytes = data[len(PLAN_MAGIC) :].partition(b"\n")
        try:
            meta = json.loads(header)
            return ICudaEngine(meta["graph"], meta["profile"], onnx_bytes, self.memory, self.logger)
        except Exception as exc:
            self.logger.log(_Severity.ERROR, f"deserialize_cuda_engine: {type(exc).__name__}: {exc}")
            return None


def tensorrt_module(memory, name: str = "tensorrt") -> types.ModuleType:
    """A module importable as `tensorrt` whose Runtime reads and writes through `memory`."""
    import importlib.machinery

    module = types.ModuleType(name, "TensorRT runtime API stand-in (devtools.trt_standins.tensorrt_runtime)")
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    module.__version__ = STANDIN_VERSION
    module.ILogger, module.TensorIOMode, module.DataType = ILogger, TensorIOMode, DataType
    module.Runtime = lambda logger: Runtime(logger, memory)
    return module
