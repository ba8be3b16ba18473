"""Reading arrays from files for the command line and the lab: ``.npy``, ``.npz``, ``.json``, ``.csv``.

Every problem with a file (missing, unknown extension, not numeric, ragged, several arrays and
no key) is an ``ArgumentError`` whose message starts with the file's name and says what is
wrong. ``file.npz:key`` and ``file.json:key`` pick one array out of a container.
"""

import csv
import io
import json
import math
import os
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from .errors import ArgumentError

EXTENSIONS = (".npy", ".npz", ".json", ".csv")
MAX_BYTES = 2**31
"""Largest array qkv reads from a file (2 GiB): a header claiming more is refused before any
memory is allocated, so a 100-byte file cannot ask for terabytes."""
MAX_DEPTH = 32
"""Deepest nesting of a JSON array (NumPy arrays have at most 64 axes; attention uses 2 to 5)."""
_KEYED = (".npz", ".json")
_NONFINITE = {"inf": math.inf, "+inf": math.inf, "-inf": -math.inf, "nan": math.nan}  # Trace.to_dict's strings


def read_array(path: str | os.PathLike[str]) -> np.ndarray:
    """The array stored in ``path``: ``.npy``; ``.npz`` (its one array, or ``file.npz:key``);
    ``.json`` (nested lists of numbers, or an object holding them: ``file.json:key``);
    ``.csv`` (comma-separated numbers, a header row skipped). Text formats give float64.

    >>> read_array("q.npy").shape          # (..., N, D)
    >>> read_array("qkv.npz:k")
    """
    file, key = _split_key(path)
    ext = _extension(file)
    if key is not None and ext not in _KEYED:
        raise ArgumentError(f"{file}: a key (:{key}) only selects an array in a .npz or .json file")
    if ext == ".npy":
        return _load(file, lambda: _npy(file), "a .npy file")
    if ext == ".npz":
        return _from_npz(file, key)
    if ext == ".json":
        return _numbers(_pick(file, _read_json(file), key), file)
    return _read_csv(file)


def read_qkv(path: str | os.PathLike[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(q, k, v)`` from one ``.npz`` or ``.json`` file holding arrays under the keys q, k and v."""
    file, key = _split_key(path)
    if key is not None or file.suffix.lower() not in _KEYED:
        raise ArgumentError(f"{path}: q, k and v are read from one .npz or .json file with keys q, k, v")
    ext = _extension(file)
    return tuple(
        _from_npz(file, n) if ext == ".npz" else _numbers(_pick(file, _read_json(file), n), file)
        for n in ("q", "k", "v")
    )  # type: ignore[return-value]


def _split_key(path: str | os.PathLike[str]) -> tuple[Path, str | None]:
    """``"a.npz:k"`` -> ``(Path("a.npz"), "k")``; a path that exists as written is never split."""
    text = os.fspath(path)
    base, sep, key = text.rpartition(":")
    if sep and Path(base).suffix.lower() in EXTENSIONS and not Path(text).exists():
        return Path(base), key
    return Path(text), None


def _extension(file: Path) -> str:
    ext = file.suffix.lower()
    if ext not in EXTENSIONS:
        known = ", ".join(EXTENSIONS)
        raise ArgumentError(f"{file}: unknown extension {ext or '(none)'!r}; qkv reads {known}")
    if not file.exists():
        raise ArgumentError(f"{file}: no such file")
    if not file.is_file():
        raise ArgumentError(f"{file}: not a file")
    return ext


def _load(file: Path, load: Any, what: str) -> Any:
    try:
        return load()
    except ArgumentError:
        raise
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, UnicodeDecodeError) as e:
        raise ArgumentError(f"{file}: not {what} ({_one_line(e)})") from None


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def _npy(file: Path) -> np.ndarray:
    """``np.load`` after checking that the header's shape fits the bytes the file holds."""
    with open(file, "rb") as f:
        _claimed(f, file.stat().st_size, str(file))
    return np.load(file, allow_pickle=False)


def _claimed(f: Any, available: int, what: str) -> None:
    """Read a ``.npy`` header from ``f`` and refuse a shape larger than ``available`` bytes or ``MAX_BYTES``."""
    fmt = np.lib.format
    version = fmt.read_magic(f)
    read_header = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
    shape, _, dtype = read_header(f)
    need = math.prod(shape) * dtype.itemsize
    payload = available - f.tell()
    if need > payload or need > MAX_BYTES:
        limit = f"the file holds {payload} bytes" if need > payload else f"qkv reads at most {MAX_BYTES} bytes"
        raise ArgumentError(f"{what}: its header claims shape {shape} of {dtype} ({need} bytes), but {limit}")


def _from_npz(file: Path, key: str | None) -> np.ndarray:
    def load() -> np.ndarray:
        with zipfile.ZipFile(file) as zf:
            names = [n.removesuffix(".npy") for n in zf.namelist()]
            name = _choose(file, names, key)
            info = zf.getinfo(name + ".npy")
            with zf.open(info) as member:
                _claimed(member, info.file_size, f"{file}:{name}")
        with np.load(file, allow_pickle=False) as z:
            return np.asarray(z[name])

    return np.asarray(_load(file, load, "a .npz archive of arrays"))


def _choose(file: Path, keys: list[str], key: str | None) -> str:
    """The key to read: the given one (which must exist) or the only one there is."""
    if key is not None:
        if key not in keys:
            raise ArgumentError(f"{file}: no array {key!r} (it has: {', '.join(keys) or 'nothing'})")
        return key
    if len(keys) != 1:
        raise ArgumentError(f"{file}: holds {len(keys)} arrays ({', '.join(keys)}); name one as {file}:KEY")
    return keys[0]


def _read_json(file: Path) -> Any:
    try:
        with open(file, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        where = f"line {e.lineno}, column {e.colno}"
        raise ArgumentError(f"{file}: not valid JSON ({e.msg} at {where})") from None
    except RecursionError:
        raise ArgumentError(f"{file}: nested too deeply to be an array (at most {MAX_DEPTH} levels)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ArgumentError(f"{file}: cannot be read as JSON text ({_one_line(e)})") from None


def _pick(file: Path, data: Any, key: str | None) -> Any:
    if isinstance(data, dict):
        return data[_choose(file, list(data), key)]
    if key is not None:
        raise ArgumentError(f"{file}: holds a {type(data).__name__}, not an object with key {key!r}")
    return data


def _numbers(data: Any, file: Path) -> np.ndarray:
    """Nested lists of numbers -> float64 array; ragged lists and non-numbers are named by position."""
    _shape(data, file, "")
    return np.array(_finite(data), dtype=np.float64)


def _shape(x: Any, file: Path, at: str, depth: int = 0) -> tuple[int, ...]:
    if depth > MAX_DEPTH:
        raise ArgumentError(f"{file}: nested too deeply to be an array (at most {MAX_DEPTH} levels)")
    if isinstance(x, list):
        shapes = [_shape(e, file, f"{at}[{n}]", depth + 1) for n, e in enumerate(x)]
        for n, s in enumerate(shapes):
            if s != shapes[0]:
                raise ArgumentError(f"{file}: ragged: {at}[{n}] has shape {s} but {at}[0] has shape {shapes[0]}")
        return (len(x), *(shapes[0] if shapes else ()))
    number = isinstance(x, (int, float)) and not isinstance(x, bool)
    if not (number or isinstance(x, str) and x.lower() in _NONFINITE):
        raise ArgumentError(f"{file}: not numeric: {at or 'the value'} is {json.dumps(x)[:40]}")
    return ()


def _finite(x: Any) -> Any:
    if isinstance(x, list):
        return [_finite(e) for e in x]
    return _NONFINITE[x.lower()] if isinstance(x, str) else x


def _read_csv(file: Path) -> np.ndarray:
    """Comma-separated numbers, one matrix row per line; a first row that is not numeric is a header."""
    text = _load(file, lambda: file.read_text(encoding="utf-8"), "a UTF-8 text file")
    try:
        rows = [
            (n, [c.strip() for c in r])
            for n, r in enumerate(csv.reader(io.StringIO(text)), 1)
            if any(c.strip() for c in r)
        ]
    except csv.Error as e:  # e.g. a field over the csv module's 128 KiB limit
        raise ArgumentError(f"{file}: not a .csv file of numbers ({_one_line(e)})") from None
    if rows and not all(_is_number(c) for c in rows[0][1]):
        rows = rows[1:]  # a header row
    if not rows:
        raise ArgumentError(f"{file}: no numbers in this .csv file")
    width = len(rows[0][1])
    for line, cells in rows:
        if len(cells) != width:
            raise ArgumentError(
                f"{file}: ragged: line {line} has {len(cells)} values but line {rows[0][0]} has {width}"
            )
        for col, c in enumerate(cells, 1):
            if not _is_number(c):
                raise ArgumentError(f"{file}: not numeric: line {line}, column {col} is {c!r}")
    return np.array([[float(c) for c in cells] for _, cells in rows], dtype=np.float64)


def _is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True
