"""Test session setup: generated kernels go to a private cache folder; on a GPU machine
(where Triton's interpreter is off and CPU tensors cannot use the Triton backend) tensors
are created on the GPU by default."""
import os
import tempfile

os.environ.setdefault("FLEXSN_DSL_CACHE", tempfile.mkdtemp(prefix="flexsn-dsl-test-cache-"))

import pytest  # noqa: E402
import torch  # noqa: E402

from flexsn_dsl.triton_runtime import interpreting  # noqa: E402

if torch.cuda.is_available() and not interpreting():
    torch.set_default_device("cuda")


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
