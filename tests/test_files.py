"""tokenpos._files, the one writer of every output: atomic, checked before a long run, and a file a plain
``open()`` would make (its mode, a symbolic link written through)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from tokenpos._files import atomic_write_text, atomic_writer, check_output_path


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_a_new_file_gets_the_umask_and_a_replaced_file_keeps_its_mode(tmp_path: Path) -> None:
    """Every output was chmod 0o644 whatever the umask or the mode of the file it replaced."""
    old = os.umask(0o077)
    try:
        new = atomic_write_text(tmp_path / "new.txt", "a")
    finally:
        os.umask(old)
    assert _mode(new) == 0o600
    kept = tmp_path / "kept.txt"
    kept.write_text("old")
    os.chmod(kept, 0o640)
    atomic_write_text(kept, "new")
    assert kept.read_text() == "new" and _mode(kept) == 0o640


def test_a_symbolic_link_is_written_through(tmp_path: Path) -> None:
    real = tmp_path / "real.txt"
    real.write_text("old")
    link = tmp_path / "link.txt"
    link.symlink_to(real)
    atomic_write_text(link, "new")
    assert link.is_symlink() and real.read_text() == "new"


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "out.txt"
    path.write_text("old")
    with pytest.raises(RuntimeError), atomic_writer(path, "w") as fh:
        fh.write("half")  # type: ignore[attr-defined]
        raise RuntimeError("interrupted")
    assert path.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


def test_check_output_path_names_what_is_wrong(tmp_path: Path) -> None:
    afile = tmp_path / "afile"
    afile.write_text("")
    with pytest.raises(NotADirectoryError, match=r"output directory '.*afile' of '.*x.png' is not a directory"):
        check_output_path(afile / "x.png")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        check_output_path(tmp_path / "missing" / "x.png")
    with pytest.raises(ValueError, match="output path must name a file, got ''"):
        check_output_path("")
    with pytest.raises(FileExistsError, match="pass --force"):
        check_output_path(afile, overwrite=False)
    assert check_output_path(tmp_path / "x.png") == tmp_path / "x.png"
    assert list(tmp_path.iterdir()) == [afile]                    # the probe is gone


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs a directory no one may create files in")
def test_a_directory_that_refuses_new_files_is_named_not_the_probe() -> None:
    with pytest.raises(OSError, match=r"cannot create '/proc/x.png' in '/proc'") as err:
        check_output_path("/proc/x.png")
    assert ".probe" not in str(err.value)
