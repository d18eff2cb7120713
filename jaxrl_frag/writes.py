"""Files written whole or not at all: a failed write leaves the earlier file as it was
and no temporary one, and names the file, not its temporary."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path


class WriteError(OSError):
    """A file that could not be written (``write_atomically``): ``filename`` names it, not
    its temporary; ``strerror`` is the cause."""


def write_atomically(path: str | Path, content: str | bytes | Callable[[Path], object]) -> Path:
    """Replace ``path`` by ``content`` whole: text, bytes, or what ``content(tmp)`` writes to
    ``tmp``, a temporary file beside ``path`` with its suffix (``NAME.tmp.png``), which then
    replaces ``path`` (``os.replace``). A failed write leaves the earlier file as it was and
    no temporary one, and raises ``WriteError`` naming ``path`` and the cause. Returns ``path``."""
    path = Path(path)
    tmp = path.with_name(f"{path.stem}.tmp{path.suffix}")
    try:
        if callable(content):
            content(tmp)
        else:
            with open(tmp, "wb") as f:
                f.write(content.encode() if isinstance(content, str) else content)
        os.replace(tmp, path)
    except BaseException as error:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if isinstance(error, OSError):
            raise WriteError(error.errno, error.strerror or str(error), str(path)) from error
        raise
    return path
