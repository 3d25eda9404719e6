"""Every generated kernel computes in its own dtype: ``benchmarks/dtype_check.py`` compiles each zoo spec's
kernels (and a spec with every function of the language, the delay layers' kernels and PlasticLinear's fused
kernels) for sm_90 with Triton's own compiler, no GPU, in
float64 and float32, and reads their PTX (issue 38: since the short-chain cores, float64 kernels compared
and fused with float32 constants, which no test on the interpreter saw).

Compiler rules differ between Triton versions (3.6, the GPU machine's, takes a Python number passed to
``tl.fma`` or compared with a tensor as float32; 3.9 does not), so the guard also runs under the oldest Triton
the package supports where ``FLEXSN_DSL_OLDEST_TRITON`` names a folder holding it (``.ci/run`` installs
Triton 3.6 there)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SPECS = sorted((ROOT / "neurons").glob("*.yaml")) + [ROOT / "tests" / "specs" / n for n in ("every_function.yaml",
                                                                             "scalar_states.yaml", "adlif_ct.yaml")]
PLASTIC = [(ROOT / "tests" / "specs" / "stdp_triplet.yaml", ROOT / "neurons" / "lif.yaml"),
           (ROOT / "tests" / "specs" / "stdp_reward.yaml", ROOT / "neurons" / "izhikevich.yaml")]
# the specs split so that pytest-xdist spreads the compiles, a process a group: each imports the runtime again
# (about 3 s); the oldest compiles the float64 kernels alone, in one (about 20 s on one core)
GROUPS = {"installed": 2, "oldest": 1}
OLDEST = os.environ.get("FLEXSN_DSL_OLDEST_TRITON", "")
TRITONS = ["installed"] + (["oldest"] if OLDEST else [])

pytestmark = pytest.mark.skipif(not (Path(__import__("triton").__file__).parent / "backends" / "nvidia").is_dir(),
                                reason="this Triton has no CUDA backend to compile with")


def _run(args: list[str], triton: str, tmp_path: Path) -> subprocess.CompletedProcess:
    path = [str(ROOT)] + ([OLDEST] if triton == "oldest" else [])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path), TRITON_CACHE_DIR=str(tmp_path / "triton"),
               FLEXSN_DSL_CACHE=str(tmp_path / "kernels"))
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "dtype_check.py"), *args], env=env,
                          capture_output=True, text=True, timeout=900)


@pytest.mark.parametrize("triton, group", [(triton, group) for triton in TRITONS for group in range(GROUPS[triton])])
def test_every_kernel_computes_in_its_dtype(triton, group, tmp_path):
    specs = SPECS[group::GROUPS[triton]]
    # the oldest: float64 (the rules that differ), each step once (its numbers are the cores', tiles or not)
    dtypes = ["float64", "--tile", "1"] if triton == "oldest" else ["float64", "float32"]
    delays = ["--delays"] if group == 0 else []  # (the delay layers' kernels, once)
    last = group == GROUPS[triton] - 1  # (PlasticLinear's fused kernels, once)
    plastic = [a for pair in PLASTIC for a in ("--plastic", *map(str, pair))] if last else []
    done = _run([str(s) for s in specs] + ["--dtype", *dtypes] + delays + plastic, triton, tmp_path)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    what = f"{len(specs)} specs" + (" and the delay kernels" if delays else "") + \
        (f" and {len(PLASTIC)} plastic kernels" if plastic else "")
    assert f"{what}: every kernel computes in its dtype" in done.stdout
    if triton == "oldest":
        assert "triton 3.6" in done.stdout.splitlines()[0]


# the guard's reading of PTX, on lines of the kinds it meets (a float64 kernel unless said otherwise)
READ = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, "benchmarks")
    from dtype_check import problems
    print(json.dumps([len(problems(ptx, dtype, {"0d3FECCCCCC0000000": "0.9"})) for dtype, ptx in json.load(sys.stdin)]))
""")
CASES = {
    "float32 arithmetic widened": ("float64", 3, """
        cvt.rn.f32.f64 %r1, %rd1;
        mul.f32 %r2, %r1, %r1;
        cvt.f64.f32 %rd2, %r2;
        st.global.b64 [%rd9], %rd2;"""),
    "a literal rounded to float32": ("float64", 1, """
        fma.rn.f64 %rd2, %rd1, 0d3FECCCCCC0000000, %rd1;"""),
    "libdevice's range checks on the high word": ("float64", 0, """
        abs.ftz.f32 %r14, %r63;
        setp.lt.f32 %p10, %r14, 0f4086232B;"""),
    "libdevice erf's 2 ** k": ("float64", 0, """
        cvt.rn.f32.f64 %r1, %rd1;
        mul.f32 %r2, %r1, 0fBFB8AA3B;
        cvt.rni.f32.f32 %r3, %r2;
        cvt.f64.f32 %rd2, %r3;
        ex2.approx.ftz.f32 %r4, %r3;
        cvt.f64.f32 %rd3, %r4;
        mul.f64 %rd4, %rd2, %rd3;"""),
    "float64 arithmetic in a float32 kernel": ("float32", 3, """
        cvt.f64.f32 %rd1, %r1;
        mul.f64 %rd2, %rd1, 0d3FECCCCCCCCCCCCD;
        cvt.rn.f32.f64 %r2, %rd2;"""),
    "libdevice sinf's reduction of a huge argument": ("float32", 0, """
        cvt.rn.f64.s64 %rd81, %rd80;
        mul.f64 %rd82, %rd81, 0d3BF921FB54442D19;
        cvt.rn.f32.f64 %r946, %rd82;"""),
}


def test_the_guard_reads_ptx_as_described(tmp_path):
    """Each kind of line counted as a problem or not, as the guard's docstring says (a float32 value that
    reaches the kernel's float64 values is one; the float32 steps of libdevice's float64 functions, which
    compute no value or an exact one, are not)."""
    cases = [(dtype, textwrap.dedent(ptx)) for dtype, _, ptx in CASES.values()]
    env = dict(os.environ, PYTHONPATH=str(ROOT), TRITON_CACHE_DIR=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", READ], input=json.dumps(cases), cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    counted = dict(zip(CASES, json.loads(done.stdout.splitlines()[-1])))
    assert counted == {name: expected for name, (_, expected, _) in CASES.items()}
