"""One writer for every file tokenpos produces (CLI outputs, checkpoints): check the path first, write atomically.

A long run (``extrapolate``, ``report``, ``bench``) calls :func:`check_output_path` for each output
before it starts, so a bad path fails in a second instead of after minutes of work. Each output is
then written to a temporary file in the same directory and renamed over the target
(:func:`atomic_write_bytes` / :func:`atomic_write_text` / :func:`atomic_writer`), so an interrupted
run (Ctrl-C, a crash, a full disk) never leaves a truncated file and never destroys the previous one.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path


def check_output_path(path: str | os.PathLike[str], *, overwrite: bool = True,
                      suffixes: tuple[str, ...] | None = None) -> Path:
    """Check, without touching any existing file, that ``path`` can be written later; returns it.

    The parent directory must exist and accept a new file (probed with a temporary file that is
    removed at once); the path must not be a directory.

    Args:
        overwrite: False refuses an existing file (``FileExistsError``).
        suffixes: allowed lower-case suffixes (e.g. ``(".png", ".svg")``), or None for any.

    Raises:
        FileNotFoundError: the parent directory does not exist.
        IsADirectoryError / FileExistsError / PermissionError: as the names say.
        ValueError: a suffix outside ``suffixes``.
    """
    target = Path(path)
    if str(path) == "" or target.name == "":
        raise ValueError(f"output path must name a file, got {str(path)!r}")
    if suffixes is not None and target.suffix.lower() not in suffixes:
        raise ValueError(f"output file {str(target)!r} must end in one of {', '.join(suffixes)}, "
                         f"got {target.suffix or 'no suffix'!r}")
    if target.is_dir():
        raise IsADirectoryError(f"output path {str(target)!r} is a directory, expected a file")
    if target.exists() and not overwrite:
        raise FileExistsError(f"output file {str(target)!r} exists; pass --force to replace it")
    parent = target.parent if str(target.parent) else Path(".")
    if parent.exists() and not parent.is_dir():
        raise NotADirectoryError(f"output directory {str(parent)!r} of {str(target)!r} is not a directory")
    if not parent.is_dir():
        raise FileNotFoundError(f"output directory {str(parent)!r} of {str(target)!r} does not exist")
    try:
        fd, probe = tempfile.mkstemp(dir=parent, prefix=f".{target.name}.", suffix=".probe")
    except OSError as exc:                               # the probe's own name would only confuse
        raise type(exc)(exc.errno, f"cannot create {str(target)!r} in {str(parent)!r}: {exc.strerror}") from None
    os.close(fd)
    os.unlink(probe)
    if target.exists() and not os.access(target, os.W_OK):
        raise PermissionError(f"output file {str(target)!r} is not writable")
    return target


@contextlib.contextmanager
def atomic_writer(path: str | os.PathLike[str], mode: str = "wb") -> Iterator[object]:
    """Open a temporary file beside ``path``; on a clean exit it is flushed, fsynced and renamed over
    ``path``; on an exception it is removed and ``path`` is left as it was.

    The file gets the mode a plain ``open()`` would give it: a replaced file's own, else 0o666 less the
    umask (the kernel applies it when the temporary file is created). A symbolic link is written through:
    the file it points to is replaced and the link stays."""
    target = Path(os.path.realpath(path)) if os.path.islink(path) else Path(path)
    parent = target.parent if str(target.parent) else Path(".")
    keep = stat.S_IMODE(os.stat(target).st_mode) if target.exists() else None
    fd, tmp = _create_beside(parent, target.name)
    try:
        with os.fdopen(fd, mode, encoding=None if "b" in mode else "utf-8") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        if keep is not None:
            os.chmod(tmp, keep)
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _create_beside(parent: Path, name: str) -> tuple[int, str]:
    """A new file ``.{name}.<random>.tmp`` in ``parent``, created with mode 0o666 so that the umask applies (as
    for any file a program opens; ``tempfile.mkstemp`` would make it 0o600): (its descriptor, its path)."""
    for _ in range(100):
        tmp = os.path.join(parent, f".{name}.{secrets.token_hex(6)}.tmp")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name beside {name!r} in {str(parent)!r}")


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (temporary file + rename); returns the path."""
    with atomic_writer(path, "wb") as fh:
        fh.write(data)  # type: ignore[attr-defined]
    return Path(path)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically; returns the path."""
    return atomic_write_bytes(path, text.encode("utf-8"))
