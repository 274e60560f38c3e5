"""calibrl._files.write_then_rename: the one temporary-file-then-rename writer of the library."""

from pathlib import Path

import pytest

from calibrl._files import write_then_rename


def test_text_and_bytes_land_whole_and_leave_no_temporary(tmp_path):
    path = tmp_path / "out.json"
    write_then_rename(path, "é\n")
    assert path.read_bytes() == "é\n".encode("utf-8")
    write_then_rename(path, b"\x00\x01")
    assert path.read_bytes() == b"\x00\x01"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


def test_a_failed_rename_leaves_the_old_file(tmp_path, monkeypatch):
    path = tmp_path / "out.json"
    path.write_text("old")

    def refuse(self, target):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "replace", refuse)
    with pytest.raises(OSError):
        write_then_rename(path, "new")
    assert path.read_text() == "old"
