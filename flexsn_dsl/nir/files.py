"""Stage 7 (NIR): a NIR file is untrusted input, like a spec: before ``nir.read`` sees it, the
path must be a regular file and the HDF5 structure is walked without reading any data, refusing
what would make reading touch anything but the file's own bytes (external storage, external or
soft links, virtual datasets) or grow without bound (nesting, objects, declared sizes)."""
from __future__ import annotations

import os
import stat
from typing import Any

from ..console import escape_controls
from ..errors import NIRError

MAX_FILE_BYTES = 1 << 30      # the file itself
MAX_DEPTH = 32                # groups inside groups
MAX_OBJECTS = 100_000         # groups and datasets
MAX_ELEMENTS = 1 << 26        # one dataset's declared elements (64 M: 512 MiB of float64)
MAX_TOTAL_ELEMENTS = 1 << 27  # all datasets together
MAX_BYTES = 1 << 30           # all datasets' declared bytes together (a compressed file may expand)


def shown(path: str | os.PathLike) -> str:
    """A path or name as printed: ``repr`` of its text (no newline or control character raw)."""
    return escape_controls(repr(os.fspath(path) if isinstance(path, os.PathLike) else str(path)))


def check_file(path: str | os.PathLike) -> None:
    """Refuse a NIR file that is not a plain HDF5 file of bounded size holding only its own data;
    a one-line NIRError naming the file and the object otherwise."""
    try:
        info = os.stat(path)
    except OSError as exc:
        raise NIRError(f"{shown(path)}: cannot read it ({exc.strerror or exc})") from None
    if not stat.S_ISREG(info.st_mode):
        kind = ("a directory" if stat.S_ISDIR(info.st_mode) else "a FIFO" if stat.S_ISFIFO(info.st_mode) else
                "a device" if stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode) else
                "a socket" if stat.S_ISSOCK(info.st_mode) else "not a regular file")
        raise NIRError(f"{shown(path)} is {kind}, not a NIR file: give a file written by nir.write")
    if info.st_size > MAX_FILE_BYTES:
        raise NIRError(f"{shown(path)} is {info.st_size} bytes, more than the {MAX_FILE_BYTES} a NIR file may hold")
    import h5py
    try:
        with h5py.File(path, "r") as f:
            _walk(f, path)
    except NIRError:
        raise
    except Exception as exc:  # noqa: BLE001 - h5py raises OSError, KeyError, RuntimeError... on a damaged file
        raise NIRError(f"{shown(path)} is not an HDF5 file h5py can read ({type(exc).__name__}: "
                       f"{str(exc).splitlines()[0] if str(exc) else 'no detail'})") from None


def _walk(root: Any, path: str | os.PathLike) -> None:
    """Every link below ``root``, depth first, each object once."""
    import h5py
    seen: set[str] = set()
    total = nbytes = 0
    todo = [(root, "/", 0)]
    while todo:
        group, name, depth = todo.pop()
        if depth > MAX_DEPTH:
            raise NIRError(f"{shown(path)}: {shown(name)} is nested {depth} groups deep, more than {MAX_DEPTH}")
        for key in group:
            where = f"{name.rstrip('/')}/{key}"
            link = group.get(key, getlink=True)
            if isinstance(link, h5py.ExternalLink):
                raise NIRError(f"{shown(path)}: {shown(where)} is an external link (to {shown(link.filename)}): "
                               "a NIR file may hold only its own data")
            if isinstance(link, h5py.SoftLink):
                raise NIRError(f"{shown(path)}: {shown(where)} is a soft link: NIR files hold none")
            item = group[key]
            info = h5py.h5o.get_info(item.id)
            token = repr(getattr(info, "token", None) or info.addr)  # the object's place in the file
            if token in seen:
                raise NIRError(f"{shown(path)}: {shown(where)} is linked twice: NIR files hold each object once")
            seen.add(token)
            if len(seen) > MAX_OBJECTS:
                raise NIRError(f"{shown(path)} holds more than {MAX_OBJECTS} groups and datasets")
            if isinstance(item, h5py.Group):
                todo.append((item, where, depth + 1))
            elif isinstance(item, h5py.Dataset):
                elements, size = _check_dataset(item, where, path)
                total, nbytes = total + elements, nbytes + size
                if total > MAX_TOTAL_ELEMENTS or nbytes > MAX_BYTES:
                    raise NIRError(f"{shown(path)} declares more than {MAX_TOTAL_ELEMENTS} values or {MAX_BYTES} "
                                   "bytes in all")
            else:
                raise NIRError(f"{shown(path)}: {shown(where)} is a {type(item).__name__}: NIR files hold only "
                               "groups and datasets")


def _check_dataset(dataset: Any, where: str, path: str | os.PathLike) -> tuple[int, int]:
    """A dataset's declared elements and bytes, after refusing external storage, virtual layouts,
    compound or array element types (one element of which may be gigabytes) and sizes beyond the limit."""
    import h5py
    dtype = dataset.dtype
    if dtype.fields or dtype.subdtype or dtype.kind not in "biufcSO":
        raise NIRError(f"{shown(path)}: {shown(where)} holds {dtype} elements: NIR arrays hold numbers or text")
    plist = dataset.id.get_create_plist()
    if plist.get_external_count() > 0:
        raise NIRError(f"{shown(path)}: {shown(where)} keeps its data in another file (external storage): "
                       "a NIR file may hold only its own data")
    if plist.get_layout() == h5py.h5d.VIRTUAL:
        raise NIRError(f"{shown(path)}: {shown(where)} is a virtual dataset (its data live in other files): "
                       "a NIR file may hold only its own data")
    elements = 1
    for n in dataset.shape or ():
        elements *= int(n)
    if elements > MAX_ELEMENTS:
        raise NIRError(f"{shown(path)}: {shown(where)} declares {elements} values, more than the {MAX_ELEMENTS} "
                       "one NIR array may hold")
    return elements, elements * dtype.itemsize
