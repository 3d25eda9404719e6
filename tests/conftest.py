"""Test session setup: generated kernels go to a private cache folder; on a GPU machine
(where Triton's interpreter is off and CPU tensors cannot use the Triton backend) tensors
are created on the GPU by default, as a user who calls ``torch.set_default_device("cuda")``
has them. Every test runs under :func:`_no_leaked_global_state`."""
import importlib.metadata
import os
import sys
import tempfile

os.environ.setdefault("FLEXSN_DSL_CACHE", tempfile.mkdtemp(prefix="flexsn-dsl-test-cache-"))

import pytest  # noqa: E402
import torch  # noqa: E402

from flexsn_dsl.plugins import ENTRY_POINT_GROUP  # noqa: E402
from flexsn_dsl.triton_runtime import interpreting  # noqa: E402

if torch.cuda.is_available() and not interpreting():
    torch.set_default_device("cuda")


# set by pytest for each test, and by libraries once a process on first use (torch's inductor, Intel's OpenMP)
LIBRARY_ENVIRONMENT = ("PYTEST_CURRENT_TEST", "TRITON_CACHE_DIR", "TRITON_PTXAS_PATH", "KMP_", "_TORCHINDUCTOR",
                       "TORCHINDUCTOR_CACHE_DIR")
INSTALLATION = tuple({sys.prefix, sys.base_prefix})  # sys.path entries inside it are added by libraries (setuptools)


def _environment() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(LIBRARY_ENVIRONMENT)}


def _backend_flags() -> dict[str, object]:
    return {"cudnn.benchmark": torch.backends.cudnn.benchmark, "cudnn.deterministic": torch.backends.cudnn.deterministic,
            "cudnn.allow_tf32": torch.backends.cudnn.allow_tf32,
            "cuda.matmul.allow_tf32": torch.backends.cuda.matmul.allow_tf32,
            "float32_matmul_precision": torch.get_float32_matmul_precision(),
            "deterministic_algorithms": torch.are_deterministic_algorithms_enabled()}


def _set_backend_flags(flags: dict[str, object]) -> None:
    torch.backends.cudnn.benchmark = flags["cudnn.benchmark"]
    torch.backends.cudnn.deterministic = flags["cudnn.deterministic"]
    torch.backends.cudnn.allow_tf32 = flags["cudnn.allow_tf32"]
    torch.backends.cuda.matmul.allow_tf32 = flags["cuda.matmul.allow_tf32"]
    torch.set_float32_matmul_precision(flags["float32_matmul_precision"])
    torch.use_deterministic_algorithms(flags["deterministic_algorithms"])


def _global_state() -> dict[str, object]:
    """What one test must leave as it found it."""
    return {"default device": torch.get_default_device(), "default dtype": torch.get_default_dtype(),
            "grad mode": torch.is_grad_enabled(), "torch.backends": _backend_flags(),
            "environment": _environment(), "working directory": os.getcwd(),
            "sys.path": [p for p in sys.path if not p.startswith(INSTALLATION)],
            "plugin entry points": sorted(str(e) for e in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)),
            "Triton interpreter": interpreting()}


def _restore(state: dict[str, object]) -> None:
    torch.set_default_device(state["default device"])
    torch.set_default_dtype(state["default dtype"])
    torch.set_grad_enabled(state["grad mode"])
    _set_backend_flags(state["torch.backends"])
    for name in set(_environment()) - set(state["environment"]):
        del os.environ[name]
    os.environ.update(state["environment"])
    os.chdir(state["working directory"])
    sys.path[:] = [p for p in sys.path if p in state["sys.path"] or p.startswith(INSTALLATION)]


@pytest.fixture(autouse=True)
def _no_leaked_global_state():
    """A test that changes process-wide state (default device or dtype, grad mode, torch.backends
    flags, environment variables, working directory, sys.path, installed plugins, Triton's
    interpreter switch) and does not put it back fails here, and the state is restored so that
    the next test starts clean."""
    before = _global_state()
    yield
    after = _global_state()
    leaked = [key for key in before if after[key] != before[key]]
    if leaked:
        _restore(before)
        details = "; ".join(_difference(key, before[key], after[key]) for key in leaked)
        pytest.fail(f"the test leaked global state: {details}", pytrace=False)


def _difference(key: str, before: object, after: object) -> str:
    if isinstance(before, dict) and isinstance(after, dict):
        changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
        return f"{key} ({', '.join(changed)})"
    return f"{key} ({before!r} -> {after!r})"


@pytest.fixture(autouse=True)
def _cpu_parametrised_tests_make_cpu_tensors(request):
    """A test parametrised with device="cpu" creates its tensors on the CPU, wherever the default device is."""
    callspec = getattr(request.node, "callspec", None)
    if callspec is not None and callspec.params.get("device") == "cpu":
        with torch.device("cpu"):
            yield
    else:
        yield


@pytest.fixture
def fresh_dynamo():
    """Each FlexSN compiled is a recompilation of one forward: leave other tests the whole recompile limit."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _patch_the_interpreter_once_a_launch() -> None:
    """Triton's interpreter patches triton.language again at every call of a @triton.jit function from a
    kernel (``_patch_lang``: a scan of the language's modules with inspect.getmembers), though the launch
    already patched the same modules and restores them when it ends; in the generated kernels, whose cores
    and helpers are such calls, that was most of a launch's time. Here a call inside a launch whose
    language modules the launch patched skips the repeat (a no-op: the patched members are no longer
    builtins, and the other attributes are set to the same values). Left alone where Triton's interpreter
    is off or its internals differ."""
    if not interpreting():
        return
    try:
        from triton.runtime import interpreter
        import triton.language as tl
    except ImportError:
        return
    patch, launch = getattr(interpreter, "_patch_lang", None), getattr(interpreter, "GridExecutor", None)
    if patch is None or launch is None or getattr(patch, "_once_a_launch", False):
        return
    run = launch.__call__
    patched: list[set[int]] = []  # the language modules patched in the launch under way

    def launch_and_forget(self, *args, **kwargs):
        patched.append(set())
        try:
            return run(self, *args, **kwargs)
        finally:
            patched.pop()

    def patch_once(fn):
        mine = {id(v) for v in fn.__globals__.values() if v is tl or v is tl.core}
        if patched and mine and mine <= patched[-1]:
            return _LangPatchedAlready()  # (a device function's call, whose scope is dropped)
        scope = patch(fn)
        if patched:
            patched[-1] |= mine
        return scope

    patch_once._once_a_launch = True
    interpreter._patch_lang = patch_once
    launch.__call__ = launch_and_forget


class _LangPatchedAlready:
    def restore(self) -> None:
        pass


_patch_the_interpreter_once_a_launch()


def _interpreter_types_once() -> None:
    """Triton's interpreter works out again, at every operation of a launch, things that depend on types alone:
    the numpy dtype of a Triton type (``_get_np_dtype``: a table of 19 types built and hashed at each call), the
    block type of an element type and a shape (``get_block_ty``, called by every block type's ``to_ir``, and
    ``block_type.with_element_ty``, for each operand a scalar is splatted or cast to: a new, equal block type, its
    shape validated again) and a tensor's attributes from its type (``tensor.__init__``: its shape as a new tuple
    of constexprs); and it works out a broadcast of two operands of one shape, which changes nothing. Here each is
    worked out once a type and looked up after, and a broadcast of equal shapes returns its operands at once, as it
    did after the work (the first two, about a sixth of an interpreted launch's time; the rest, a third of the
    Python calls left; the same values: types are never changed once made). Pointer types, which cannot be hashed,
    are worked out as before. It also types each binary operation's operands by the general rules, where two of
    one integer or float32/64 type, or a float32/64 tensor and a Python number, take the tensor's type: those
    return at once (about a tenth of an interpreted launch), others are checked as before. Left alone where
    Triton's interpreter is off or its internals differ."""
    if not interpreting():
        return
    try:
        from triton.runtime import interpreter
        from triton.language.semantic import TritonSemantic
        import triton.language as tl
    except ImportError:
        return
    np_dtype, builder = getattr(interpreter, "_get_np_dtype", None), getattr(interpreter, "InterpreterBuilder", None)
    broadcast = getattr(TritonSemantic, "broadcast_impl_value", None)
    binary_checked = getattr(TritonSemantic, "binary_op_type_checking_impl", None)
    if None in (np_dtype, broadcast, binary_checked, getattr(builder, "get_block_ty", None),
                getattr(tl.block_type, "with_element_ty", None)) or getattr(np_dtype, "_once", False):
        return
    init, floats = tl.tensor.__init__, (tl.float32, tl.float64)
    np_dtypes: dict[object, object] = {}
    block_types: dict[tuple, object] = {}
    tensor_types: dict[int, tuple] = {}  # id(type): (type, the attributes init set but the handle): type kept alive

    def np_dtype_once(tt_dtype):
        element = tt_dtype.element_ty if type(tt_dtype) is tl.block_type else tt_dtype
        if isinstance(element, tl.pointer_type):
            return np_dtype(element)
        found = np_dtypes.get(element)
        if found is None:
            found = np_dtypes[element] = np_dtype(element)
        return found

    def block_type(dtype, shape):
        if isinstance(dtype, tl.pointer_type):
            return tl.block_type(dtype, shape)
        key = (dtype, tuple(shape))
        found = block_types.get(key)
        if found is None:
            found = block_types[key] = tl.block_type(dtype, shape)
        return found

    def tensor_init_once(self, handle, type):
        known = tensor_types.get(id(type))
        if known is None or known[0] is not type:
            init(self, handle, type)
            if len(tensor_types) > 4096:
                tensor_types.clear()
            tensor_types[id(type)] = (type, {k: v for k, v in vars(self).items() if k != "handle"})
            return
        self.__dict__.update(known[1])
        self.handle = handle

    def broadcast_equal_shapes_at_once(self, lhs, rhs):
        left, right = lhs.type, rhs.type
        if left is right or (type(left) is tl.block_type and type(right) is tl.block_type
                             and left.shape.values == right.shape.values):
            return lhs, rhs
        return broadcast(self, lhs, rhs)

    def binary_checked_at_once(self, lhs, rhs, *args, **kwargs):
        left, right = type(lhs), type(rhs)
        if left is tl.tensor and right is tl.tensor:  # one type, an integer or float32/64: it computes in it
            left, right = lhs.type, rhs.type
            if left.scalar == right.scalar and (left.scalar in floats or left.scalar.is_int()):
                return (lhs, rhs) if left is right or left == right else self.broadcast_impl_value(lhs, rhs)
        elif left is tl.tensor and right in (float, int) and lhs.type.scalar in floats and -2**31 <= rhs < 2**31:
            return self.broadcast_impl_value(lhs, self.scalar_constant(rhs, lhs.type.scalar))  # (the tensor's type)
        elif right is tl.tensor and left in (float, int) and rhs.type.scalar in floats and -2**31 <= lhs < 2**31:
            return self.broadcast_impl_value(self.scalar_constant(lhs, rhs.type.scalar), rhs)
        return binary_checked(self, lhs, rhs, *args, **kwargs)

    np_dtype_once._once = True
    interpreter._get_np_dtype = np_dtype_once
    builder.get_block_ty = lambda self, dtype, shape: block_type(dtype, shape)
    tl.block_type.with_element_ty = lambda self, scalar_ty: block_type(scalar_ty, self.shape)
    tl.tensor.__init__ = tensor_init_once
    TritonSemantic.broadcast_impl_value = broadcast_equal_shapes_at_once
    TritonSemantic.binary_op_type_checking_impl = binary_checked_at_once


_interpreter_types_once()
