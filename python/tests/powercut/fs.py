"""powercut file system: a FUSE passthrough that forgets, at a power cut,
everything that was not made durable with ``fsync``/``fdatasync``.

Run as ``python fs.py WORK MOUNTPOINT`` (root, /dev/fuse, libfuse 3 and
``mfusepy``): it serves ``WORK/backing`` at ``MOUNTPOINT`` in the foreground
until the mount is unmounted (``fusermount3 -u MOUNTPOINT``). **Every unmount
is a power cut**: there is no clean shutdown. After the kernel lets go of the
mount, ``WORK/backing`` is rewritten to hold exactly the durable state, the
outcome is written to ``WORK/poweroff.json`` and the process exits 0 (non-zero
if it could not). Mounting again starts from that state, as a machine boots
from its disk. The same idea as LazyFS's ``clear-cache``, with directories
modelled too. ``python/tests/powercut/__init__.py`` drives it for tests.

The durability model (what survives a power cut)
-------------------------------------------------
*Everything in ``WORK/backing`` when the file system is mounted is durable.*
After that, each change is volatile until it is synced:

* **File data** (contents and size, of one inode): durable as of the last
  ``fsync`` or ``fdatasync`` of that file (either one: both make the data
  durable). ``write`` and ``truncate`` (also ``O_TRUNC``) since then are lost:
  the file comes back with its contents at its last sync, or empty if it was
  created since the mount and never synced. ``close`` (``flush``) syncs nothing.
* **Directory entries** (names → inodes, of one directory): durable as of the
  last ``fsync`` of that directory. Every ``create``, ``mkdir``, ``rename``
  (as seen from each directory it touches), ``unlink`` and ``rmdir`` since then
  is undone: a name created since is gone, a name removed since is back,
  pointing at the inode it pointed at then (with that inode's durable data).
  Syncing a file does *not* make its name durable, and syncing a directory
  does not make its own entry in its parent durable, nor its files' data.
  This is POSIX's promise, stricter than ext4 in practice (whose journal
  commits a file's creation with its fsync): a program that passes here
  survives a filesystem that gives only what POSIX promises.
* A rename is not atomic across two directories: each directory's view of it
  is durable when that directory is synced (a file can then come back under
  both names, as hard links, or under neither). Within one directory (how
  databases and kvtier use it) it is atomic: the directory's fsync records
  either the old or the new entries, never something in between.
* Not modelled: metadata other than size (mode, owner, times: they come back
  as they are now), partial or reordered loss within a file (it is all or
  nothing per sync: no torn pages), symbolic and hard links and device nodes
  (refused with ``EPERM``), extended attributes (``ENOSYS``). Locks (``flock``)
  are left to the kernel, which keeps them locally.

How it is built: every call is passed through to ``WORK/backing`` (the live,
volatile state that readers see), single-threaded (``nothreads``), so no two
calls overlap. Beside it the durable state is kept: for every directory its
durable entries, and for every file either "clean" (durable data = live
data) or a copy of its durable data taken just before the first change after
a sync (copy-before-write; a file created since the mount needs none: its
durable data is empty). Inodes are named by their number in the backing
file system, kept unique by a hard link to every file under
``WORK/shadow/inodes`` (and removed directories parked under
``WORK/shadow/graves``) until the power cut, so that no number is reused.
At the cut a new tree is built from the root's durable entries, downward,
hard-linking clean files and saved copies into it, and swapped in for the old.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import sys
import time
from pathlib import Path

import mfusepy as fuse

#: ``_File.saved`` for a file created since the mount and never synced.
EMPTY = "<empty>"


class _File:
    """A regular file's durable data: ``None`` (the live data), ``EMPTY``, or the path of a copy."""

    __slots__ = ("saved",)

    def __init__(self, saved: str | None) -> None:
        self.saved = saved


class _Dir:
    """A directory's durable entries: name -> inode number."""

    __slots__ = ("durable",)

    def __init__(self, durable: dict[str, int]) -> None:
        self.durable = durable


class PowercutFS(fuse.Operations):
    """The FUSE operations (see the module docstring for the model)."""

    use_ns = True

    def __init__(self, work: Path) -> None:
        self.work = work
        self.backing = work / "backing"
        self.shadow = work / "shadow"
        shutil.rmtree(self.shadow, ignore_errors=True)
        for d in ("inodes", "saved", "graves"):
            (self.shadow / d).mkdir(parents=True)
        self.nodes: dict[int, _File | _Dir] = {}
        self.fds: dict[int, tuple[int, int]] = {}  # fh -> (backing fd, inode)
        self.next_fh = 1
        self.syncs = {"fsync": 0, "fsyncdir": 0}
        self.root = self._adopt(self.backing)

    # -- the durable state --------------------------------------------------

    def _adopt(self, path: Path) -> int:
        """Records what is under ``path`` (at mount) as durable; returns its inode."""
        st = os.lstat(path)
        if stat.S_ISDIR(st.st_mode):
            entries = {}
            for e in os.scandir(path):
                entries[e.name] = self._adopt(Path(e.path))
            self.nodes[st.st_ino] = _Dir(entries)
        elif stat.S_ISREG(st.st_mode):
            if st.st_ino not in self.nodes:
                os.link(path, self._inode_link(st.st_ino))
                self.nodes[st.st_ino] = _File(None)
        else:
            raise SystemExit(f"powercut: {path} is neither a file nor a directory; not modelled")
        return st.st_ino

    def _inode_link(self, ino: int) -> Path:
        return self.shadow / "inodes" / str(ino)

    def _file(self, ino: int) -> _File:
        node = self.nodes.get(ino)
        if not isinstance(node, _File):
            raise fuse.FuseOSError(errno.EIO)  # an inode this model did not see created
        return node

    def _before_change(self, ino: int) -> None:
        """Copy-before-write: keeps the durable data of a clean file before it changes."""
        node = self._file(ino)
        if node.saved is None:
            copy = self.shadow / "saved" / str(ino)
            shutil.copyfile(self._inode_link(ino), copy)
            node.saved = str(copy)

    def _p(self, path: str) -> str:
        return str(self.backing) + path

    # -- files --------------------------------------------------------------

    def getattr(self, path, fh=None):
        st = os.fstat(self.fds[fh][0]) if fh is not None and fh in self.fds else os.lstat(self._p(path))
        nlink = st.st_nlink - 1 if stat.S_ISREG(st.st_mode) else st.st_nlink  # less the shadow link
        return {
            "st_mode": st.st_mode, "st_nlink": nlink, "st_uid": st.st_uid, "st_gid": st.st_gid,
            "st_size": st.st_size, "st_blocks": st.st_blocks, "st_atime": st.st_atime_ns,
            "st_mtime": st.st_mtime_ns, "st_ctime": st.st_ctime_ns,
        }

    def _handle(self, fd: int) -> int:
        fh = self.next_fh
        self.next_fh += 1
        self.fds[fh] = (fd, os.fstat(fd).st_ino)
        return fh

    def open(self, path, flags):
        p = self._p(path)
        if flags & os.O_TRUNC:
            self._before_change(os.lstat(p).st_ino)
        fd = os.open(p, flags)
        self._file(os.fstat(fd).st_ino)
        return self._handle(fd)

    def create(self, path, mode, flags):
        p = self._p(path)
        if os.path.lexists(p):
            return self.open(path, flags & ~os.O_CREAT)
        fd = os.open(p, flags | os.O_CREAT | os.O_EXCL, mode)
        ino = os.fstat(fd).st_ino
        os.link(p, self._inode_link(ino))
        self.nodes[ino] = _File(EMPTY)
        return self._handle(fd)

    def read(self, path, size, offset, fh):
        return os.pread(self.fds[fh][0], size, offset)

    def write(self, path, data, offset, fh):
        fd, ino = self.fds[fh]
        self._before_change(ino)
        return os.pwrite(fd, data, offset)

    def truncate(self, path, length, fh=None):
        if fh is not None and fh in self.fds:
            fd, ino = self.fds[fh]
            self._before_change(ino)
            os.ftruncate(fd, length)
        else:
            p = self._p(path)
            self._before_change(os.lstat(p).st_ino)
            os.truncate(p, length)
        return 0

    def flush(self, path, fh):
        return 0  # close(2) makes nothing durable

    def release(self, path, fh):
        fd, _ = self.fds.pop(fh)
        os.close(fd)
        return 0

    def fsync(self, path, datasync, fh):
        node = self._file(self.fds[fh][1])
        if node.saved not in (None, EMPTY):
            os.unlink(node.saved)
        node.saved = None
        self.syncs["fsync"] += 1
        return 0

    # -- directories ---------------------------------------------------------

    def readdir(self, path, fh):
        return [".", "..", *os.listdir(self._p(path))]

    def opendir(self, path):
        return 0

    def releasedir(self, path, fh):
        return 0

    def fsyncdir(self, path, datasync, fh):
        p = self._p(path)
        node = self.nodes.get(os.lstat(p).st_ino)
        if not isinstance(node, _Dir):
            raise fuse.FuseOSError(errno.EIO)
        entries = {}
        for e in os.scandir(p):
            ino = e.stat(follow_symlinks=False).st_ino
            if ino not in self.nodes:
                raise fuse.FuseOSError(errno.EIO)
            entries[e.name] = ino
        node.durable = entries
        self.syncs["fsyncdir"] += 1
        return 0

    def mkdir(self, path, mode):
        p = self._p(path)
        os.mkdir(p, mode)
        self.nodes[os.lstat(p).st_ino] = _Dir({})
        return 0

    def _bury(self, p: str) -> None:
        """Removes the empty directory ``p`` by parking it, so its inode number stays taken."""
        if os.listdir(p):
            raise fuse.FuseOSError(errno.ENOTEMPTY)
        os.rename(p, self.shadow / "graves" / str(os.lstat(p).st_ino))

    def rmdir(self, path):
        self._bury(self._p(path))
        return 0

    def unlink(self, path):
        os.unlink(self._p(path))  # the shadow link keeps the inode (and its data)
        return 0

    def rename(self, old, new):
        po, pn = self._p(old), self._p(new)
        if os.path.isdir(pn) and not os.path.islink(pn):
            if not os.path.isdir(po):
                raise fuse.FuseOSError(errno.EISDIR)
            self._bury(pn)
        os.rename(po, pn)
        return 0

    # -- the rest, passed through or refused -----------------------------------

    def access(self, path, amode):
        if not os.access(self._p(path), amode):
            raise fuse.FuseOSError(errno.EACCES)
        return 0

    def chmod(self, path, mode):
        os.chmod(self._p(path), mode)
        return 0

    def chown(self, path, uid, gid):
        os.chown(self._p(path), uid, gid)
        return 0

    def utimens(self, path, times=None):
        if times:
            os.utime(self._p(path), ns=times)
        else:
            os.utime(self._p(path))
        return 0

    def statfs(self, path):
        sv = os.statvfs(self.backing)
        return {k: getattr(sv, k) for k in ("f_bsize", "f_frsize", "f_blocks", "f_bfree", "f_bavail",
                                            "f_files", "f_ffree", "f_favail", "f_flag", "f_namemax")}

    def symlink(self, target, source):
        raise fuse.FuseOSError(errno.EPERM)

    def link(self, target, source):
        raise fuse.FuseOSError(errno.EPERM)

    def mknod(self, path, mode, dev):
        raise fuse.FuseOSError(errno.EPERM)

    # -- the power cut -------------------------------------------------------

    def power_off(self) -> dict:
        """Replaces the backing tree by the durable state; returns what was lost."""
        new = self.work / "backing.new"
        shutil.rmtree(new, ignore_errors=True)
        new.mkdir()
        made: dict[int, Path] = {}
        durable_paths: set[str] = set()
        reverted = 0

        def build(dino: int, dst: Path, rel: str, above: frozenset) -> None:
            nonlocal reverted
            node = self.nodes[dino]
            assert isinstance(node, _Dir)
            for name, ino in sorted(node.durable.items()):
                child = self.nodes[ino]
                p, r = dst / name, f"{rel}/{name}"
                if isinstance(child, _Dir):
                    if ino in above:
                        continue  # a directory renamed into its own subtree: not modelled
                    p.mkdir()
                    durable_paths.add(r + "/")
                    build(ino, p, r, above | {ino})
                    continue
                durable_paths.add(r)
                if ino in made:
                    os.link(made[ino], p)
                elif child.saved is None:
                    os.link(self._inode_link(ino), p)
                elif child.saved == EMPTY:
                    p.touch()
                    reverted += 1
                else:
                    os.link(child.saved, p)
                    reverted += 1
                made.setdefault(ino, p)

        build(self.root, new, "", frozenset({self.root}))
        live_paths = set()
        for d, dirs, files in os.walk(self.backing):
            rel = d[len(str(self.backing)):]
            live_paths.update(f"{rel}/{n}/" for n in dirs)
            live_paths.update(f"{rel}/{n}" for n in files)
        old = self.work / "backing.old"
        os.rename(self.backing, old)
        os.rename(new, self.backing)
        shutil.rmtree(old)
        shutil.rmtree(self.shadow)
        return {
            "files": len(made),
            "reverted_files": reverted,
            "lost_names": sorted(live_paths - durable_paths),
            "resurrected_names": sorted(durable_paths - live_paths),
            "syncs": self.syncs,
        }


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(f"usage: {argv[0]} WORK MOUNTPOINT", file=sys.stderr)
        return 2
    work, mnt = Path(argv[1]), argv[2]
    (work / "backing").mkdir(parents=True, exist_ok=True)
    report = work / "poweroff.json"
    report.unlink(missing_ok=True)
    ops = PowercutFS(work)
    # nothreads: one call at a time; hard_remove: no .fuse_hidden files for unlinked open files.
    fuse.FUSE(ops, mnt, foreground=True, nothreads=True, hard_remove=True, fsname="powercut")
    t0 = time.monotonic()
    out = ops.power_off()
    out["restore_s"] = round(time.monotonic() - t0, 3)
    tmp = work / "poweroff.json.tmp"
    tmp.write_text(json.dumps(out))
    tmp.rename(report)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
