"""Where a command will write, checked before the work that fills it: a folder that cannot be made or
written to is one :class:`~servelab.core.errors.ConfigError` line naming the option that chose it, not an
``OSError`` after minutes of grading or a load sweep. Made here (the folders a command makes anyway)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from servelab.core.errors import ConfigError


def writable_folder(path: str | Path, option: str) -> Path:
    """Make folder ``path`` (with its parents) and create and remove a file in it; ``option`` names what
    chose the path (``--dir /x``, ``bench.output_dir=/x``) in the error."""
    path = Path(path)
    existing = next((p for p in (path, *path.parents) if p.exists()), None)
    if existing is not None and not existing.is_dir():
        raise ConfigError(f"{option}: cannot write to {path} ({existing} is a file, not a folder); "
                          "choose a folder you can write to")
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as exc:
        where = exc.filename if exc.filename and str(exc.filename) != str(path) else None
        reason = exc.strerror or type(exc).__name__
        raise ConfigError(f"{option}: cannot write to {path} ({reason}" + (f": {where}" if where else "")
                          + "); choose a folder you can write to") from None
    return path


def writable_file(path: str | Path, option: str) -> Path:
    """:func:`writable_folder` for the folder of file ``path`` (made now; the file is written later), and
    ``path`` itself not a folder."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"{option}: {path} is a folder; give a file name")
    writable_folder(path.parent, option)
    return path
