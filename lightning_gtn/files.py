"""Opening files that untrusted input names: regular files only.

A named pipe blocks its reader until a writer comes (forever, if none does), and a device such as
``/dev/zero`` never ends; a path in a config, a checkpoint or a manifest may name either. Every
reader of such a path opens it here: without blocking, then checked to be a regular file (through
symlinks) before a byte is read. Other errors (no such file, no permission) are raised as ``open``
raises them.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from typing import IO, Any

__all__ = ["open_regular", "read_regular", "text_lines", "npy_header", "npy_data"]


def open_regular(path, what: str, mode: str = "rb", **kwargs: Any) -> IO[Any]:
    """``open(path, mode, **kwargs)`` for reading, refusing anything but a regular file.

    Args:
        path: a path (str or ``os.PathLike``).
        what: names the file in the error (``"ARPA file"``, ``"data.lexicon"``).
        mode: ``"rb"`` or ``"r"`` (text; ``kwargs`` go to ``open``: encoding, errors, newline).

    Raises:
        ValueError: the path is a pipe, a device, a socket or a folder.
        OSError: as ``open`` (the file does not exist, ...).
    """
    if mode not in ("r", "rb"):
        raise ValueError(f"open_regular: reads only ('r' or 'rb'), got {mode!r}")
    p = os.fspath(path)
    fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"{what} {p!r}: not a regular file (pipes, devices and folders are not read)")
        os.set_blocking(fd, True)
        return open(fd, mode, **kwargs)
    except BaseException:
        os.close(fd)
        raise


def read_regular(path, what: str, max_bytes: int) -> bytes:
    """The bytes of the regular file ``path``; ``ValueError`` if it holds more than ``max_bytes``."""
    with open_regular(path, what) as f:
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ValueError(f"{what} {os.fspath(path)!r}: larger than {max_bytes} bytes")
    return data


def text_lines(f: IO[str], path, max_chars: int) -> Iterator[tuple[int, str]]:
    """The non-blank lines of the UTF-8 text file ``f`` (opened at ``path``), numbered from 1 and
    without their line ends; a line is read at most ``max_chars + 1`` characters at a time.

    Raises:
        ValueError: the text is not UTF-8, or a line is longer than ``max_chars`` characters
            (naming ``path`` and the line).
    """
    n = 0
    while True:
        try:
            line = f.readline(max_chars + 1)
        except UnicodeDecodeError as e:
            raise ValueError(f"{path}: not UTF-8 text ({e})") from None
        if not line:
            return
        n += 1
        if len(line) > max_chars:
            raise ValueError(f"{path}:{n}: line longer than {max_chars} characters")
        if line.strip():
            yield n, line.rstrip("\r\n")


def npy_header(f, what: str, max_header: int = 10_000):
    """``(shape, fortran_order, dtype)`` from the header of the ``.npy`` stream ``f`` (read up to
    the data, at most ``max_header`` bytes of header; object arrays refused)."""
    import numpy as np

    fmt = np.lib.format
    try:
        version = fmt.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = fmt.read_array_header_1_0(f, max_header_size=max_header)
        elif version in ((2, 0), (3, 0)):
            shape, fortran, dtype = fmt.read_array_header_2_0(f, max_header_size=max_header)
        else:
            raise ValueError(f".npy version {version} is not read")
    except Exception as e:
        raise ValueError(f"{what}: not a readable .npy array: {' '.join(str(e).split())[:200]}") from None
    if dtype.hasobject or dtype.fields is not None:
        raise ValueError(f"{what}: the .npy array holds {dtype} (objects and records are not read)")
    return tuple(shape), bool(fortran), dtype


def npy_data(f, shape, fortran: bool, dtype, what: str):
    """The array of the ``.npy`` stream ``f`` after :func:`npy_header`: exactly its bytes are read
    (a compressed member decompresses no further), as a writable array."""
    import numpy as np

    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    data = bytearray(nbytes)  # filled in place: the array's own memory, no second copy
    view, got = memoryview(data), 0
    while got < nbytes:
        n = f.readinto(view[got:])
        if not n:
            raise ValueError(f"{what}: the .npy array is truncated ({got} of {nbytes} bytes of data)")
        got += n
    return np.frombuffer(data, dtype=dtype).reshape(shape, order="F" if fortran else "C")
