"""Whole-or-nothing writes: the one way draftsmith writes a file or directory that another process, or a
later run, reads (cache shards and manifests, regenerated shards, checkpoints and their LATEST / BEST
links, exports, reports).

Each write goes to a temporary beside its destination and moves over it with ``os.replace``: a reader
finds the old content or the new, never half, and a kill mid-write leaves the destination as it was.
The temporary's name carries its writer, ``.<name>.<host>-<pid>.<random>.tmp``, so

- two writers of one destination (two benches preparing the demo's data, two threads) never share a
  temporary: each replaces its own, and the last one wins whole;
- :func:`remove_stale_temps` can tell a killed write's leftover (its process is gone) from a live
  write in flight (another process's), and delete only the first.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

# A temporary whose owner cannot be told (another host's, or a reused pid) is a killed write's once it is this
# old: a write holds its temporary for one write + fsync (seconds for a 100 MB shard or a draft checkpoint).
STALE_TEMP_S = 600.0
HOST = re.sub(r"[^A-Za-z0-9_-]", "_", socket.gethostname()) or "host"
_OWNED = re.compile(r"\.(?P<host>[A-Za-z0-9_-]+)-(?P<pid>\d+)\.[A-Za-z0-9_]+\.tmp$")


def owned_prefix(path: Path) -> str:
    """``.<name>.<host>-<pid>.``: the start of every temporary this process makes for ``path``."""
    return f".{Path(path).name}.{HOST}-{os.getpid()}."


@contextmanager
def replacing(path: Path, *, mode: int = 0o644, synced: bool = False) -> Iterator[Path]:
    """Yield a fresh temporary file beside ``path`` for the body to write (by name: safetensors, torch.save,
    savefig). When the body returns, the temporary is fsynced and moved over ``path``; when it raises, the
    temporary is deleted and ``path`` is untouched. ``mode``: the file's permissions (mkstemp's are 0600;
    what draftsmith writes is read like any ordinary file). ``synced``: the body fsyncs the file itself
    (:func:`write_bytes`, on the file it has open), so it is not opened a second time for it."""
    path = Path(path)
    fd, name = tempfile.mkstemp(prefix=owned_prefix(path), suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        os.chmod(tmp, mode)
        yield tmp
        if not synced:
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_bytes(path: Path, data: bytes) -> None:
    """``data`` to ``path``, whole or not at all."""
    with replacing(path, synced=True) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())


def write_text(path: Path, text: str) -> None:
    """``text`` (UTF-8) to ``path``, whole or not at all."""
    write_bytes(path, text.encode("utf-8"))


def write_json(path: Path, obj: Any) -> None:
    """``obj`` as indented JSON (one trailing newline) to ``path``, whole or not at all."""
    write_text(path, json.dumps(obj, indent=2) + "\n")


def temp_dir_beside(path: Path) -> Path:
    """A fresh, empty, owned directory beside ``path`` to build a whole directory in before
    :func:`swap_dir` moves it in (mode 0755: mkdtemp's 0700 would hide a checkpoint from other users)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=owned_prefix(path), suffix=".tmp", dir=path.parent))
    tmp.chmod(0o755)
    return tmp


def swap_dir(tmp: Path, out: Path) -> None:
    """Put the complete directory ``tmp`` at ``out``. An ``out`` that exists is first renamed to an owned
    temporary (a directory cannot be replaced by rename while it has entries), so a kill between the two
    renames leaves a leftover that :func:`remove_stale_temps` clears, never a half directory at ``out``."""
    tmp, out = Path(tmp), Path(out)
    if not out.exists():
        os.replace(tmp, out)
        return
    old = out.parent / f"{owned_prefix(out)}old{time.monotonic_ns()}.tmp"
    os.replace(out, old)
    os.replace(tmp, out)
    shutil.rmtree(old, ignore_errors=True)


def point(link: Path, target: str) -> None:
    """Make ``link`` a symlink to ``target`` atomically (a new link under an owned name, then os.replace
    over the old one), so a reader of LATEST or BEST never finds none."""
    link = Path(link)
    tmp = link.parent / f"{owned_prefix(link)}link{time.monotonic_ns()}.tmp"
    os.symlink(target, tmp)
    try:
        os.replace(tmp, link)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: no signal, only the check; PermissionError = another user's, alive
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def remove_stale_temps(out: Path, pattern: str = "*.tmp", min_age_s: float = STALE_TEMP_S) -> int:
    """Delete the temporaries (files, directories, links) in ``out`` matching ``pattern`` that no live write
    owns (a kill -9 mid-write leaves them; nothing lists them, so nothing reads them): one named by this host
    and a process that is gone, one in an old unowned form (``shard-000003.safetensors.tmp``), or one last
    written ``min_age_s`` ago or more. A temporary of a live process on this host, or a young one of another
    host's, may be a write in flight: deleting it would make that writer's ``os.replace`` fail, so it stays.
    Returns how many were deleted."""
    now, n = time.time(), 0
    for tmp in Path(out).glob(pattern):
        m = _OWNED.search(tmp.name)
        # a pid can be checked on this host only; this process's own pid may be its own write in flight
        # (another thread's), so that one, like another host's, goes by age alone
        owner_gone = m is None or (m["host"] == HOST and int(m["pid"]) != os.getpid() and not _alive(int(m["pid"])))
        try:
            if owner_gone or now - tmp.lstat().st_mtime >= min_age_s:
                if tmp.is_dir() and not tmp.is_symlink():
                    shutil.rmtree(tmp)
                else:
                    tmp.unlink()
                n += 1
        except FileNotFoundError:  # its writer renamed or removed it meanwhile
            pass
    return n
