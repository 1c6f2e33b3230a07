"""A FUSE file system that loses, at a "power cut", everything that was not synced.

Every operation passes through to a backing folder, so the processes above it see an
ordinary file system. Alongside, it keeps the *durable* state a power loss would leave:

- file data as of each file's last ``fsync``/``fdatasync`` (a file never synced is empty);
- the entries of each folder as of its last ``fsync`` of the folder itself (a folder whose
  entries were never synced is empty), so a new or renamed name that was not synced
  vanishes or comes back under its old name.

Files are followed by an id of their own (not the backing inode number, which the backing
file system reuses), so a rename keeps a file's durable data with it.

Making a folder named ``.powercut-<anything>`` at the top cuts the power: from then on
every operation fails with EIO (nothing more becomes durable, nothing more is answered),
the durable state is written as an ordinary folder tree to the ``snapshot`` folder given at
start, and the ``mkdir`` itself fails with ECANCELED to say it is done. The caller then
kills what used the mount, unmounts it (``fusermount -u``), and mounts the snapshot (a new
backing folder) again: that is "the machine came back".

Run: ``python -m tests.support.powerfs BACKING MOUNTPOINT STATE SNAPSHOT`` (STATE: a folder
for the durable copies of file data). It serves in the foreground, one request at a time.
"""

from __future__ import annotations

import errno
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from fuse import FUSE, FuseOSError, Operations

CUT_PREFIX = ".powercut-"
_ROOT_ID = 1


class PowerLossFS(Operations):
    def __init__(self, backing: Path, state: Path, snapshot: Path) -> None:
        self.backing = backing
        self.state = state
        self.snapshot = snapshot
        self.frozen = False
        self.next_id = _ROOT_ID
        self.ids: dict[str, int] = {}  # live path ("/" + relative) -> id
        self.is_dir: dict[int, bool] = {}
        self.entries: dict[int, dict[str, int]] = {}  # durable entries of each folder
        self.dirty: dict[int, list[tuple[int, int]]] = {}  # byte ranges written since the last sync
        self.shrunk: dict[int, int] = {}  # the smallest size a truncate left since the last sync
        state.mkdir(parents=True, exist_ok=True)
        self._adopt("/", is_dir=True)
        for folder, dirs, files in os.walk(backing):
            rel = "/" + os.path.relpath(folder, backing) if Path(folder) != backing else "/"
            here = self.ids[rel]
            for name in dirs + files:
                child = self._adopt(self._join(rel, name), is_dir=name in dirs)
                self.entries[here][name] = child
                if name in files:  # what was there at mount is durable
                    shutil.copyfile(os.path.join(folder, name), self._data(child))

    # -- bookkeeping -------------------------------------------------------------------------
    @staticmethod
    def _join(parent: str, name: str) -> str:
        return parent.rstrip("/") + "/" + name

    def _adopt(self, path: str, *, is_dir: bool) -> int:
        node = self.next_id
        self.next_id += 1
        self.ids[path] = node
        self.is_dir[node] = is_dir
        if is_dir:
            self.entries[node] = {}
        return node

    def _real(self, path: str) -> str:
        return os.path.join(self.backing, path.lstrip("/"))

    def _data(self, node: int) -> Path:
        return self.state / str(node)

    def _check(self) -> None:
        if self.frozen:
            raise FuseOSError(errno.EIO)

    def _id(self, path: str) -> int:
        node = self.ids.get(path)
        if node is None:  # created behind our back (cannot happen through the mount)
            node = self._adopt(path, is_dir=os.path.isdir(self._real(path)))
        return node

    def _sync_file(self, path: str) -> None:
        node = self._id(path)
        target = self._data(node)
        src = os.open(self._real(path), os.O_RDONLY)
        dst = os.open(target, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if node in self.shrunk:
                os.ftruncate(dst, self.shrunk.pop(node))
            for start, end in self.dirty.pop(node, []):
                os.pwrite(dst, os.pread(src, end - start, start), start)
            os.ftruncate(dst, os.fstat(src).st_size)
        finally:
            os.close(src)
            os.close(dst)

    def _sync_dir(self, path: str) -> None:
        node = self._id(path)
        self.entries[node] = {name: self._id(self._join(path, name)) for name in os.listdir(self._real(path))}

    def _cut(self) -> None:
        self.frozen = True
        if self.snapshot.exists():
            shutil.rmtree(self.snapshot)
        self._materialise(_ROOT_ID, self.snapshot, set())

    def _materialise(self, node: int, where: Path, seen: set[int]) -> None:
        where.mkdir()
        seen = seen | {node}
        for name, child in self.entries.get(node, {}).items():
            target = where / name
            if self.is_dir.get(child):
                if child not in seen:
                    self._materialise(child, target, seen)
            elif self._data(child).exists():
                shutil.copyfile(self._data(child), target)
            else:
                target.touch()  # the name is durable, its data never was: an empty file

    def _moved(self, old: str, new: str) -> None:
        for path in [p for p in self.ids if p == new or p.startswith(new + "/")]:
            del self.ids[path]
        for path in [p for p in self.ids if p == old or p.startswith(old + "/")]:
            self.ids[new + path[len(old) :]] = self.ids.pop(path)

    def _dropped(self, path: str) -> None:
        self.ids.pop(path, None)

    # -- operations ----------------------------------------------------------------------------
    def access(self, path: str, amode: int) -> int:
        self._check()
        if not os.access(self._real(path), amode):
            raise FuseOSError(errno.EACCES)
        return 0

    def getattr(self, path: str, fh: int | None = None) -> dict[str, Any]:
        self._check()
        try:
            st = os.fstat(fh) if fh is not None else os.lstat(self._real(path))
        except OSError as exc:
            raise FuseOSError(exc.errno or errno.EIO) from None
        keys = ("st_atime", "st_ctime", "st_gid", "st_mode", "st_mtime", "st_nlink", "st_size", "st_uid", "st_blocks")
        attrs = {key: getattr(st, key) for key in keys}
        attrs["st_ino"] = self._id(path)
        return attrs

    def readdir(self, path: str, fh: int) -> list[str]:
        self._check()
        return [".", "..", *os.listdir(self._real(path))]

    def statfs(self, path: str) -> dict[str, Any]:
        self._check()
        st = os.statvfs(self._real(path))
        keys = ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files", "f_flag", "f_frsize", "f_namemax")
        return {key: getattr(st, key) for key in keys}

    def mkdir(self, path: str, mode: int) -> None:
        if path.startswith("/" + CUT_PREFIX) and path.count("/") == 1:
            if not self.frozen:
                self._cut()
            raise FuseOSError(errno.ECANCELED)
        self._check()
        os.mkdir(self._real(path), mode)
        self._adopt(path, is_dir=True)

    def rmdir(self, path: str) -> None:
        self._check()
        os.rmdir(self._real(path))
        self._dropped(path)

    def unlink(self, path: str) -> None:
        self._check()
        os.unlink(self._real(path))
        self._dropped(path)

    def rename(self, old: str, new: str) -> None:
        self._check()
        os.rename(self._real(old), self._real(new))
        self._moved(old, new)

    def chmod(self, path: str, mode: int) -> None:
        self._check()
        os.chmod(self._real(path), mode)

    def chown(self, path: str, uid: int, gid: int) -> None:
        self._check()
        os.chown(self._real(path), uid, gid)

    def utimens(self, path: str, times: tuple[float, float] | None = None) -> None:
        self._check()
        os.utime(self._real(path), times)

    def create(self, path: str, mode: int, fi: Any = None) -> int:
        self._check()
        fd = os.open(self._real(path), os.O_RDWR | os.O_CREAT | os.O_EXCL, mode)
        self._adopt(path, is_dir=False)
        return fd

    def open(self, path: str, flags: int) -> int:
        self._check()
        # Read-write underneath whatever was asked (the kernel may read around a write);
        # the kernel hands over every write's offset, also under O_APPEND.
        keep = flags & ~(os.O_ACCMODE | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_TRUNC)
        fd = os.open(self._real(path), keep | (os.O_RDWR if flags & os.O_ACCMODE else os.O_RDONLY))
        if flags & os.O_TRUNC:
            os.ftruncate(fd, 0)
        if flags & os.O_TRUNC:
            self.shrunk[self._id(path)] = 0
        return fd

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        self._check()
        return os.pread(fh, size, offset)

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        self._check()
        written = os.pwrite(fh, data, offset)
        ranges = self.dirty.setdefault(self._id(path), [])
        if ranges and ranges[-1][1] == offset:
            ranges[-1] = (ranges[-1][0], offset + written)  # an append: one growing range
        else:
            ranges.append((offset, offset + written))
            if len(ranges) > 256:  # a file written all over (SQLite's -shm): merge
                ranges[:] = [(min(r[0] for r in ranges), max(r[1] for r in ranges))]
        return written

    def truncate(self, path: str, length: int, fh: int | None = None) -> None:
        self._check()
        if fh is not None:
            os.ftruncate(fh, length)
        else:
            os.truncate(self._real(path), length)
        node = self._id(path)
        self.shrunk[node] = min(length, self.shrunk.get(node, length))

    def flush(self, path: str, fh: int) -> None:
        self._check()

    def release(self, path: str, fh: int) -> None:
        os.close(fh)  # also after the cut: the descriptor must not leak

    def fsync(self, path: str, datasync: int, fh: int) -> None:
        self._check()
        self._sync_file(path)

    def fsyncdir(self, path: str, datasync: int, fh: int) -> None:
        self._check()
        self._sync_dir(path)

    def symlink(self, target: str, source: str) -> None:
        raise FuseOSError(errno.EPERM)  # nekomem makes none; not modelled

    def link(self, target: str, source: str) -> None:
        raise FuseOSError(errno.EPERM)

    def readlink(self, path: str) -> str:
        self._check()
        return os.readlink(self._real(path))


def main(argv: list[str]) -> int:
    backing, mountpoint, state, snapshot = (Path(a) for a in argv[1:5])
    FUSE(PowerLossFS(backing, state, snapshot), str(mountpoint), foreground=True, nothreads=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
