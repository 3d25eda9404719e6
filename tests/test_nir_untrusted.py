"""NIR files and graphs are untrusted input (issue 30, classes 1, 5 and 6): a file is checked before
nir.read sees it (no external storage, external or soft links, virtual datasets, special files;
nesting and sizes bounded), every value per element (naming node, field and index), and every
failure is a one-line flexsn_dsl.NIRError (the CLI: one `error:` line)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import flexsn_dsl
from flexsn_dsl import NIRError
from flexsn_dsl.cli import main

nir = pytest.importorskip("nir")  # in the dev extra
h5py = pytest.importorskip("h5py")
ROOT = Path(__file__).resolve().parents[1]
SECRET = np.arange(6, dtype=np.float64).reshape(3, 2) + 1000.0  # what must never become imported weights


def _graph(**lif) -> object:
    fields = dict(tau=np.full(3, 0.01), r=np.ones(3), v_leak=np.zeros(3), v_threshold=np.ones(3), v_reset=np.zeros(3))
    fields.update(lif)
    return nir.NIRGraph.from_list(nir.Affine(weight=np.ones((3, 2)), bias=np.zeros(3)), nir.LIF(**fields))


def _file(tmp_path: Path) -> Path:
    path = tmp_path / "net.nir"
    nir.write(path, _graph())
    return path


def _secret(tmp_path: Path) -> tuple[Path, Path]:
    """A raw secret (for external storage) and an HDF5 secret (for links and virtual datasets)."""
    raw = tmp_path / "secret.bin"
    raw.write_bytes(SECRET.tobytes())
    h5 = tmp_path / "secret.h5"
    with h5py.File(h5, "w") as f:
        f["data"] = SECRET
    return raw, h5


WEIGHT = "node/nodes/affine/weight"


def _external_storage(path: Path, raw: Path, h5: Path) -> None:
    with h5py.File(path, "r+") as f:
        del f[WEIGHT]
        f.create_dataset(WEIGHT, shape=(3, 2), dtype="f8", external=[(str(raw), 0, SECRET.nbytes)])


def _external_link(path: Path, raw: Path, h5: Path) -> None:
    with h5py.File(path, "r+") as f:
        del f[WEIGHT]
        f[WEIGHT] = h5py.ExternalLink(str(h5), "/data")


def _soft_link(path: Path, raw: Path, h5: Path) -> None:
    with h5py.File(path, "r+") as f:
        del f[WEIGHT]
        f[WEIGHT] = h5py.SoftLink("/node/nodes/affine/bias")


def _virtual(path: Path, raw: Path, h5: Path) -> None:
    layout = h5py.VirtualLayout(shape=(3, 2), dtype="f8")
    layout[:] = h5py.VirtualSource(str(h5), "data", shape=(3, 2))
    with h5py.File(path, "r+") as f:
        del f[WEIGHT]
        f.create_virtual_dataset(WEIGHT, layout)


def _huge(path: Path, raw: Path, h5: Path) -> None:  # a small file declaring 2**28 values
    with h5py.File(path, "r+") as f:
        del f[WEIGHT]
        f.create_dataset(WEIGHT, shape=(1 << 14, 1 << 14), dtype="f8", chunks=(1024, 1024), compression="gzip")


def _deep(path: Path, raw: Path, h5: Path) -> None:
    with h5py.File(path, "r+") as f:
        f.create_group("/".join(["g"] * 40))


def _wide_elements(path: Path, raw: Path, h5: Path) -> None:  # 64 elements of 8 MiB each, compressed to nothing
    with h5py.File(path, "r+") as f:
        del f[WEIGHT]
        f.create_dataset(WEIGHT, shape=(64,), dtype=np.dtype((np.float64, (1024, 1024))), compression="gzip")


def _named_type(path: Path, raw: Path, h5: Path) -> None:
    with h5py.File(path, "r+") as f:
        f["node/kind"] = np.dtype("f8")  # a committed datatype


def _twice(path: Path, raw: Path, h5: Path) -> None:  # a hard link back up the tree: a walk without end
    with h5py.File(path, "r+") as f:
        f["node/nodes/affine/again"] = f["node"]


@pytest.mark.parametrize("craft, message", [
    (_external_storage, "keeps its data in another file (external storage)"),
    (_external_link, "is an external link (to "),
    (_soft_link, "is a soft link: NIR files hold none"),
    (_virtual, "is a virtual dataset"),
    (_huge, "declares 268435456 values, more than the 67108864"),
    (_deep, "nested 33 groups deep, more than 32"),
    (_twice, "is linked twice"),
    (_wide_elements, "elements: NIR arrays hold numbers or text"),
    (_named_type, "is a Datatype: NIR files hold only groups and datasets"),
])
def test_a_file_that_reaches_beyond_itself_or_grows_without_bound_is_refused(craft, message, tmp_path, capsys):
    path = _file(tmp_path)
    assert flexsn_dsl.from_nir(path, dt=1e-3) is not None  # the plain file reads
    craft(path, *_secret(tmp_path))
    with pytest.raises(NIRError) as info:
        flexsn_dsl.from_nir(path, dt=1e-3, backend="torch")
    assert message in str(info.value) and "\n" not in str(info.value), str(info.value)
    for verb in (["show"], ["import", "--dt", "1e-3"]):
        assert main(["nir", *verb[:1], str(path), *verb[1:]]) == 1
        out, err = capsys.readouterr()
        assert out == "" and err.startswith("error: ") and err.count("\n") == 1 and message in err, err


@pytest.mark.parametrize("special", ["fifo", "/dev/zero", "directory"])
def test_special_files_are_refused_before_they_are_opened(special, tmp_path):
    """A FIFO would block a reader and /dev/zero never ends: the CLI refuses them at once (a subprocess with
    a time limit of minutes, so that a regression fails instead of hanging the suite)."""
    if special == "fifo":
        path = tmp_path / "pipe.nir"
        os.mkfifo(path)
    elif special == "directory":
        path = tmp_path
    else:
        path = Path(special)
        if not path.exists():
            pytest.skip("no /dev/zero on this system")
    run = subprocess.run([sys.executable, "-m", "flexsn_dsl", "nir", "show", str(path)], capture_output=True,
                         text=True, timeout=300, cwd=ROOT)
    kind = {"fifo": "a FIFO", "/dev/zero": "a device", "directory": "a directory"}[special]
    assert run.returncode == 1 and run.stderr == f"error: {str(path)!r} is {kind}, not a NIR file: give a file written " \
                                                  "by nir.write\n", run.stderr
    with pytest.raises(NIRError, match=f"is {kind}, not a NIR file"):
        flexsn_dsl.from_nir(path, dt=1.0)


def test_nested_graphs_are_bounded_without_recursion_errors():
    graph = _graph()
    for _ in range(40):  # (900 gave a RecursionError before; the bound holds for any depth)
        graph = nir.NIRGraph.from_list(graph)
    with pytest.raises(NIRError, match=r"^the graph nests graphs 33 deep, more than 32$"):
        flexsn_dsl.from_nir(graph, dt=1e-3)


@pytest.mark.parametrize("lif, message", [
    (dict(tau=np.array([0.01, 0.0, -0.01])), "node 'lif', field 'tau', index [1]: 0.0 is not > 0"),
    (dict(tau=np.array([0.01, 0.02, -0.01])), "node 'lif', field 'tau', index [2]: -0.01 is not > 0"),
    (dict(v_threshold=np.array([1.0, np.nan, 1.0])), "node 'lif', field 'v_threshold', index [1]: nan is not a finite "
                                                    "number"),
    (dict(tau=np.array([0.01, 0.02 + 0.001j, 0.03])), "node 'lif', field 'tau', index [1]: (0.02+0.001j) is complex"),
    (dict(r=np.array([1.0, np.inf, 1.0])), "node 'lif', field 'r', index [1]: inf is not a finite number"),
])
def test_every_value_is_checked_per_element(lif, message):
    with pytest.raises(NIRError) as info:
        flexsn_dsl.from_nir(_graph(**lif), dt=1e-3, backend="torch")
    assert str(info.value).startswith(message), str(info.value)


def test_nan_weights_are_refused_naming_the_element():
    weight = np.ones((3, 2))
    weight[2, 1] = np.nan
    graph = nir.NIRGraph.from_list(nir.Affine(weight=weight, bias=np.zeros(3)), nir.LIF(
        tau=np.full(3, 0.01), r=np.ones(3), v_leak=np.zeros(3), v_threshold=np.ones(3), v_reset=np.zeros(3)))
    with pytest.raises(NIRError, match=r"^node 'affine', field 'weight', index \[2, 1\]: nan is not a finite number$"):
        flexsn_dsl.from_nir(graph, dt=1e-3)


def test_a_crafted_graph_gives_one_line_errors_not_tracebacks(tmp_path, capsys):
    """A node whose field nir cannot interpret raises deep inside torch or numpy: a one-line NIRError."""
    pool = nir.SumPool2d(kernel_size=np.array([2, 2]), stride=np.array([0, 1]), padding=np.array([0, 0]))
    graph = nir.NIRGraph.from_list(pool, type_check=False)  # (torch would divide by the zero stride)
    with pytest.raises(NIRError, match=r"stride must be 2 whole number\(s\) of at least 1, got \[0, 1\]"):
        flexsn_dsl.from_nir(graph, dt=1.0)
    path = tmp_path / "text.nir"
    with h5py.File(path, "w") as f:
        f["node/type"] = "NIRGraph"  # no nodes, no edges
    assert main(["nir", "import", str(path), "--dt", "1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "internal error" not in err, err


def test_names_with_newlines_cannot_forge_rows(tmp_path, capsys):
    graph = nir.NIRGraph(nodes={"input": nir.Input(np.array([2])), "a\nz  LIF  [9]  [9]": nir.Affine(
        weight=np.ones((3, 2)), bias=np.zeros(3)), "output": nir.Output(np.array([3]))},
        edges=[("input", "a\nz  LIF  [9]  [9]"), ("a\nz  LIF  [9]  [9]", "output")])
    path = tmp_path / "odd\nname.nir"
    nir.write(path, graph)
    assert main(["nir", "show", str(path)]) == 0
    out = capsys.readouterr().out
    assert "a\\nz  LIF" in out and not any(line.startswith("z  LIF") for line in out.splitlines())
    assert len(out.splitlines()) == 6  # header, rule, three nodes, edges
    os.mkfifo(tmp_path / "pipe\n.nir")
    assert main(["nir", "show", str(tmp_path / "pipe\n.nir")]) == 1
    assert "pipe\\n.nir" in capsys.readouterr().err


def test_an_imported_neurons_spec_shows_the_values_in_use():
    net = flexsn_dsl.from_nir(_graph(v_reset=np.full(3, -0.5), v_threshold=np.full(3, 0.7)), dt=1e-3, backend="torch")
    m = next(x for x in net.modules() if isinstance(x, flexsn_dsl.FlexSN))
    values = {n: p.value for n, p in m.spec.parameters.items()}
    assert values == {"tau": 0.01, "r": 1.0, "v_leak": 0.0, "v_threshold": 0.7, "v_reset": -0.5, "dt": 1e-3}
    assert "v_reset=-0.5" in repr(m)


def test_to_nir_of_the_readmes_per_channel_plif_and_of_a_batch_of_one():
    C = 4
    with torch.device("cpu"):
        net = torch.nn.Sequential(flexsn_dsl.PerStep(torch.nn.Conv2d(2, C, 3, padding=1)),
                                  flexsn_dsl.load(ROOT / "neurons" / "plif_channel.yaml", sizes={"C": C},
                                                  backend="torch"))
        with torch.no_grad():
            net[1].w.copy_(torch.tensor([0.1, -0.2, 0.3, 0.0]).reshape(C, 1, 1))
        for batch in (2, 1):
            graph = flexsn_dsl.to_nir(net, torch.rand(3, batch, 2, 8, 8), dt=1.0)
            assert graph.nodes["input"].input_type["input"].tolist() == [2, 8, 8]
            tau = graph.nodes["1"].tau  # 1 / sigmoid(w) per channel, over the layer's shape
            assert tau.shape == (C, 8, 8)
            w = np.array([0.1, -0.2, 0.3, 0.0], dtype=np.float32).astype(np.float64)  # w is a float32 parameter
            np.testing.assert_allclose(tau[:, 0, 0], 1 + np.exp(-w), rtol=1e-12)
        lif = torch.nn.Sequential(torch.nn.Linear(5, 3), flexsn_dsl.load(ROOT / "neurons" / "lif.yaml",
                                                                          backend="torch"))
        graph = flexsn_dsl.to_nir(lif, torch.rand(4, 1, 5), dt=1.0)
    assert graph.nodes["input"].input_type["input"].tolist() == [5] and graph.nodes["1"].tau.shape == (3,)


@pytest.mark.parametrize("spec, message", [
    ("modulated_lif", "module '1': modulated_lif takes 2 inputs ['x', 'm']; NIR neurons take one"),
    ("lif_refractory", "module '1': lif_refractory gives 2 outputs ['s', 'v']; NIR neurons give one"),
])
def test_to_nir_refuses_neurons_nir_cannot_hold_in_one_line(spec, message):
    with torch.device("cpu"):
        net = torch.nn.Sequential(torch.nn.Linear(4, 4), flexsn_dsl.load(ROOT / "neurons" / f"{spec}.yaml",
                                                                          backend="torch"))
        with pytest.raises(NIRError) as info:
            flexsn_dsl.to_nir(net, torch.rand(3, 2, 4), dt=1.0)
    assert str(info.value).startswith(message) and "\n" not in str(info.value), str(info.value)


def test_a_huge_delay_or_input_is_refused_before_memory_is_taken(tmp_path, capsys):
    graph = nir.NIRGraph.from_list(nir.Delay(delay=np.array([1.0, 1e9])))
    with pytest.raises(NIRError, match=r"^node 'delay': a delay of 1e\+09 steps of dt=1.0, more than the 1048576"):
        flexsn_dsl.from_nir(graph, dt=1.0)
    path = tmp_path / "wide.nir"
    nir.write(path, nir.NIRGraph(nodes={"input": nir.Input(np.array([4])), "output": nir.Output(np.array([4]))},
                                 edges=[("input", "output")]))
    with h5py.File(path, "r+") as f:
        for end in ("input", "output"):  # it claims 2**40 values a step
            del f[f"node/nodes/{end}/shape"]
            f[f"node/nodes/{end}/shape"] = np.array([1 << 20, 1 << 20])
    assert main(["nir", "import", str(path), "--dt", "1"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "--steps 0 (build only)" in err and err.count("\n") == 1, err


def test_padding_beyond_the_kernel_is_refused():
    conv = nir.Conv2d(input_shape=(1, 1), weight=np.ones((2, 1, 3, 3)), stride=1, padding=(12000, 12000), dilation=1,
                      groups=1, bias=np.zeros(2))
    with pytest.raises(NIRError, match=r"padding \[12000, 12000\] is more than the kernel \[3, 3\]"):
        flexsn_dsl.from_nir(nir.NIRGraph.from_list(conv, type_check=False), dt=1.0)



def _lif(n, **fields) -> object:
    values = dict(tau=np.full(n, 0.01), r=np.ones(n), v_leak=np.zeros(n), v_threshold=np.ones(n), v_reset=np.zeros(n))
    return nir.LIF(**{**values, **fields})


def _mutated() -> object:
    graph = nir.NIRGraph.from_list(nir.Affine(weight=np.ones((5, 3)), bias=np.zeros(5)), _lif(5))
    graph.nodes["lif"] = _lif(4, tau=np.array([0.01, 0.02, 0.03, 0.04]))  # after nir's type check
    return graph


def _unchecked(*nodes, edges) -> object:
    return nir.NIRGraph(nodes=dict(nodes), edges=edges, type_check=False)


def _two_sizes_into_one() -> object:
    return _unchecked(("input", nir.Input(np.array([3]))), ("a", nir.Affine(weight=np.ones((4, 3)), bias=np.zeros(4))),
                      ("b", nir.Affine(weight=np.ones((5, 3)), bias=np.zeros(5))), ("output", nir.Output(np.array([4]))),
                      edges=[("input", "a"), ("input", "b"), ("a", "output"), ("b", "output")])


@pytest.mark.parametrize("make, message", [
    (_mutated, "node 'lif': field 'tau' has shape [4], but its input (the neurons it has) has shape [5]; give one value "
               "or that shape"),
    (lambda: nir.NIRGraph.from_list(nir.Flatten(np.array([3, 3, 3]), start_dim=5)),
     "node 'flatten': start_dim=5, end_dim=-1 do not fit its input of shape [3, 3, 3] (dimensions of one sample"),
    (lambda: _unchecked(("input", nir.Input(np.array([3]))), ("fc", nir.Affine(weight=np.ones((7, 3)), bias=np.zeros(7))),
                        ("lif", _lif(4)), ("output", nir.Output(np.array([4]))),
                        edges=[("input", "fc"), ("fc", "lif"), ("lif", "output")]),
     "node 'lif': field 'tau' has shape [4], but its input (the neurons it has) has shape [7]"),
    (_two_sizes_into_one, "node 'output': the edges into it bring shapes [4] and [5] (from 'b'); edges into one node "
                          "add up, so their shapes must agree"),
    (lambda: nir.NIRGraph.from_list(nir.Input(np.array([2, 6, 6])), nir.Conv2d(None, np.ones((2, 3, 3, 3)), 1, 1, 1, 1,
                                                                                np.zeros(2)), type_check=False),
     "node 'conv2d': its input has shape [2, 6, 6], but a Conv2d of weight [2, 3, 3, 3] and groups=1 takes [3, ...]"),
    (lambda: _unchecked(("input", nir.Input(np.array([3]))), ("lost", _lif(3)), ("output", nir.Output(np.array([3]))),
                        edges=[("input", "output")]),
     "node 'lost' is not reached from an Input node"),
])
def test_graphs_made_in_memory_pass_the_checks_files_get(make, message):
    """However a graph was made (mutated after nir's type check, or without it), from_nir checks the shapes along
    every edge, the neuron counts, Flatten's dimensions; each failure a one-line NIRError naming the node."""
    with pytest.raises(NIRError) as info:
        flexsn_dsl.from_nir(make(), dt=1e-3, backend="torch")
    assert str(info.value).startswith(message) and "\n" not in str(info.value), str(info.value)


def test_a_file_nir_reads_passes_the_same_checks(tmp_path):
    """nir's own type check lets Flatten(start_dim=5) through (it appends a dimension); the file is refused as the
    graph in memory is."""
    graph = nir.NIRGraph.from_list(nir.Flatten(np.array([3, 3, 3]), start_dim=5))
    nir.write(tmp_path / "flat.nir", graph)
    with pytest.raises(NIRError, match=r"^node 'flatten': start_dim=5, end_dim=-1 do not fit its input of shape"):
        flexsn_dsl.from_nir(tmp_path / "flat.nir", dt=1.0)


def test_an_input_of_another_shape_is_refused_naming_the_input():
    net = flexsn_dsl.from_nir(_graph(), dt=1e-3, backend="torch")
    with pytest.raises(ValueError, match=r"^input 'input' takes \[T, B, 2\], got \[4, 2, 3\]$"):
        net(torch.zeros(4, 2, 3))
