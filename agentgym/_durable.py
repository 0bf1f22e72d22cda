"""Files that survive a kill or a crash: written whole or not at all, then synced.

Why one place: run folders (the trainer's status and config, an eval's run.json and summary)
are read back by ``--resume``; a half-written file there would lose a run. A temp file that
is fsynced, renamed over the target and followed by a sync of the folder leaves the old file
or the new one after a ``kill -9`` or a power loss, never a half or an empty one.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from ._errors import ConfigError


def temp_path(path: Path) -> Path:
    """A fresh temp file beside ``path`` to write it through (``.<name>.<8 hex>.tmp``)."""
    return path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")


def remove_temp_files(folder: Path) -> list[Path]:
    """Remove the ``*.tmp`` files in ``folder`` (if it exists); returns them.

    They are `temp_path`'s and ``write_jsonl``'s (``x.jsonl.tmp``). Why: a ``kill -9``
    between a temp file's creation and its rename leaves it for good (the ``finally`` that
    removes it never runs). Only a folder's one writer may call it, when it opens the folder
    (an eval's ``--out``, a training run's folder): another live writer's temp file would go.
    """
    if not folder.is_dir():
        return []
    found = [p for p in folder.glob("*.tmp") if p.is_file()]  # pathlib's * takes dotfiles too
    for p in found:
        p.unlink(missing_ok=True)
    return found


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via a fsynced temp file and a rename."""
    tmp = temp_path(path)
    try:
        with tmp.open("w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    """Make a folder's entries (a rename into it) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


#: Kernel file systems: root may "write" there (`os.access` says so), yet no folder can be made.
_KERNEL_FOLDERS = (Path("/proc"), Path("/sys"))


def kernel_file_system(path: Path) -> str | None:
    """Why ``path`` can hold no run folder if it lies under /proc or /sys; else None."""
    resolved = Path(os.path.realpath(path.expanduser()))  # resolve() raises on a symlink loop
    kernel = next((k for k in _KERNEL_FOLDERS if resolved.is_relative_to(k)), None)
    if kernel is None:
        return None
    return f"is under {kernel}, the kernel's own file system, where no folder can be made; give "\
        "a folder on a disk"  # fmt: skip


def check_folder_can_be_made(path: Path, option: str) -> None:
    """Refuse a run folder that is, or lies under, a file, or that cannot be written, up front.

    Otherwise the run fails at its first write, after the model loaded, with a traceback.
    ``option`` names what the user set (``--out``, ``output_dir``). As root, ``os.access``
    passes /proc and /sys: ``output_dir: /proc/x`` passed train's ``--dry-run``.
    """
    if (kernel := kernel_file_system(path)) is not None:
        raise ConfigError(f"{option} {path} {kernel}")
    try:
        existing = next(p for p in (path, *path.parents) if p.exists())
    except OSError as exc:  # a name over the file system's limit (ENAMETOOLONG), a loop ...
        raise ConfigError(
            f"{option} {path}: {exc.strerror or exc}; choose another {option}"
        ) from None
    if not existing.is_dir():
        raise ConfigError(
            f"{option} {path}: {existing} is a file, not a folder; choose another {option}"
        )
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(f"{option} {path}: cannot write in {existing}; choose another {option}")
