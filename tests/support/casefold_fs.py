"""A case-insensitive, case-preserving file system for tests (FUSE, via fusepy): a
passthrough to a backing folder in which every path component is matched to an existing
entry case-insensitively, as on Windows (NTFS) and macOS (APFS) by default. A new entry
keeps the spelling it was created with.

Run as ``python -m tests.support.casefold_fs BACKING MOUNTPOINT`` (foreground); the tests
start it in a subprocess and unmount it with ``fusermount -u``. Names are compared with
the same per-character simple case mapping NTFS applies (``nekomem.stores.namefold.fold``),
so fullwidth ``ｌａｎ`` and ASCII ``Lan`` stay two names, as they do on such disks.
"""

from __future__ import annotations

import errno
import os
import sys
import threading
from typing import Any

from fuse import FUSE, FuseOSError, Operations  # type: ignore[import-untyped]

from nekomem.stores.namefold import fold


class CaseFold(Operations):  # type: ignore[misc]
    def __init__(self, backing: str) -> None:
        self.backing = os.path.realpath(backing)
        self._mutex = threading.Lock()

    # -- the folding ------------------------------------------------------------------
    def _real(self, path: str) -> str:
        """The backing path for ``path``: each existing component in its stored spelling,
        the first missing one and the rest as given."""
        real = self.backing
        parts = [p for p in path.split("/") if p]
        for i, part in enumerate(parts):
            candidate = os.path.join(real, part)
            if os.path.lexists(candidate):
                real = candidate
                continue
            key = fold(part)
            try:
                match = next((name for name in os.listdir(real) if fold(name) == key), None)
            except OSError:
                match = None
            if match is None:
                return os.path.join(real, *parts[i:])
            real = os.path.join(real, match)
        return real

    def _new(self, path: str) -> str:
        """The backing path of an entry being created: an existing look-alike is it."""
        return self._real(path)

    # -- metadata ---------------------------------------------------------------------
    def getattr(self, path: str, fh: Any = None) -> dict[str, Any]:
        try:
            st = os.lstat(self._real(path))
        except OSError as exc:
            raise FuseOSError(exc.errno) from None
        keys = ("st_atime", "st_ctime", "st_gid", "st_mode", "st_mtime", "st_nlink", "st_size", "st_uid")
        return {key: getattr(st, key) for key in keys}

    def readdir(self, path: str, fh: Any) -> list[str]:
        return [".", "..", *os.listdir(self._real(path))]

    def statfs(self, path: str) -> dict[str, Any]:
        st = os.statvfs(self._real(path))
        keys = ("f_bavail", "f_bfree", "f_blocks", "f_bsize", "f_favail", "f_ffree", "f_files", "f_flag", "f_frsize", "f_namemax")
        return {key: getattr(st, key) for key in keys}

    def chmod(self, path: str, mode: int) -> None:
        os.chmod(self._real(path), mode)

    def chown(self, path: str, uid: int, gid: int) -> None:
        os.chown(self._real(path), uid, gid)

    def utimens(self, path: str, times: Any = None) -> None:
        os.utime(self._real(path), times)

    def access(self, path: str, amode: int) -> None:
        if not os.access(self._real(path), amode):
            raise FuseOSError(errno.EACCES)

    # -- entries ----------------------------------------------------------------------
    def mkdir(self, path: str, mode: int) -> None:
        with self._mutex:
            os.mkdir(self._new(path), mode)

    def rmdir(self, path: str) -> None:
        os.rmdir(self._real(path))

    def unlink(self, path: str) -> None:
        os.unlink(self._real(path))

    def rename(self, old: str, new: str) -> None:
        with self._mutex:
            os.rename(self._real(old), self._new(new))

    def symlink(self, target: str, source: str) -> None:
        os.symlink(source, self._new(target))

    def readlink(self, path: str) -> str:
        return os.readlink(self._real(path))

    def link(self, target: str, source: str) -> None:
        os.link(self._real(source), self._new(target))

    # -- files ------------------------------------------------------------------------
    def open(self, path: str, flags: int) -> int:
        return os.open(self._real(path), flags)

    def create(self, path: str, mode: int, fi: Any = None) -> int:
        with self._mutex:
            return os.open(self._new(path), os.O_RDWR | os.O_CREAT, mode)

    def read(self, path: str, size: int, offset: int, fh: int) -> bytes:
        return os.pread(fh, size, offset)

    def write(self, path: str, data: bytes, offset: int, fh: int) -> int:
        return os.pwrite(fh, data, offset)

    def truncate(self, path: str, length: int, fh: Any = None) -> None:
        if fh is not None:
            os.ftruncate(fh, length)
        else:
            os.truncate(self._real(path), length)

    def flush(self, path: str, fh: int) -> None:
        return None

    def release(self, path: str, fh: int) -> None:
        os.close(fh)

    def fsync(self, path: str, datasync: int, fh: int) -> None:
        if datasync:
            os.fdatasync(fh)
        else:
            os.fsync(fh)

    def fsyncdir(self, path: str, datasync: int, fh: Any) -> None:
        return None


def main() -> None:
    backing, mountpoint = sys.argv[1], sys.argv[2]
    FUSE(CaseFold(backing), mountpoint, foreground=True, nothreads=False, allow_other=False, default_permissions=False)


if __name__ == "__main__":
    main()
