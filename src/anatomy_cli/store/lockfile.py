"""Directory locks that name their owner, and the owner identity they use (no torch).

An owner is {"pid", "start", "host"}: the process id, the process start time (field 22 of
/proc/<pid>/stat, clock ticks since boot; None where there is no /proc) and the host name. A
recycled pid has another start time, so a lock or a 'running' summary left by a dead process is
never mistaken for a live one; a zombie counts as dead; an owner on another host (a shared file
system) cannot be checked and counts as alive.

DirLock(folder) is held while `folder/.lock` names a live owner. The protocol:

  take   write our identity to a private temp file, then os.link() it to `.lock`. link() creates
         the name atomically and fails if it exists, so the lock never exists without its owner
         inside (the old create-then-write left an empty file that a second process read as stale).
  stale  if link() failed, the taker takes an exclusive flock() on the folder itself and reads
         `.lock` again under it: a live owner means Locked; a dead owner (or no owner at all:
         garbage, empty) means it renames its temp file over `.lock`; a `.lock` gone meanwhile (its
         owner released it) means link() again. Every takeover and every release happens under that
         flock, and a takeover replaces `.lock` without ever removing it (so no unguarded link() can
         slip in between), hence two takers cannot both win: the second one to get the flock reads
         the first one's live identity and gives up.
  drop   under the same flock, unlink `.lock` only if it still names us.

flock() is released by the kernel when its holder dies, so a crash cannot wedge the protocol; the
lock itself outlives a SIGKILL and is taken over as stale by the next taker.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import tempfile
from pathlib import Path

try:
    import fcntl
except ImportError:  # not POSIX: takeovers are not serialised (no supported platform lacks it)
    fcntl = None

LOCK = ".lock"


class Locked(RuntimeError):
    """A directory is in use by another live process (the CLI's exit code 3)."""


def start_time(pid: int) -> int | None:
    """The process start time in clock ticks since boot, or None (no /proc, or no such process)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()  # the command name may hold spaces and ')'
    return int(fields[19]) if len(fields) > 19 else None  # field 22 counting pid and comm


def _zombie(pid: int) -> bool:
    with contextlib.suppress(OSError, IndexError):
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] == "Z"
    return False


def identity(pid: int | None = None) -> dict:
    """This process (or `pid` on this host) as an owner record."""
    pid = os.getpid() if pid is None else pid
    return {"pid": pid, "start": start_time(pid), "host": socket.gethostname()}


def alive(owner: dict | None) -> bool:
    """Whether the owner process still runs: same pid and the same start time, not a zombie."""
    pid = owner.get("pid") if isinstance(owner, dict) else None
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return False
    if owner.get("host") not in (None, socket.gethostname()):
        return True  # cannot see another host's processes: assume it is alive
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    if _zombie(pid):
        return False
    started = owner.get("start")
    return started is None or start_time(pid) in (None, started)


def describe(owner: dict) -> str:
    host = owner.get("host")
    return f"pid {owner.get('pid')}" + (f" on {host}" if host and host != socket.gethostname() else "")


def read_owner(path: Path) -> dict | None:
    """The owner a lock file names; None when it is missing or holds no owner (garbage, empty).

    A bare integer (the format before owners had a start time) is read as a pid. A lock that exists
    but cannot be read (another user's) raises PermissionError: it is not ours to call stale.
    """
    try:
        text = Path(path).read_text(encoding="utf-8").strip()
    except (FileNotFoundError, UnicodeDecodeError):
        return None
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return None
    if isinstance(data, int) and not isinstance(data, bool):
        data = {"pid": data}
    pid = data.get("pid") if isinstance(data, dict) else None
    return data if isinstance(pid, int) and not isinstance(pid, bool) else None


class DirLock:
    """`with DirLock(folder):` holds folder/.lock for this process (see the module docstring).

    `what` names the folder in the Locked message ("sweep directory", "run directory").
    """

    error: type[Locked] = Locked

    def __init__(self, folder: Path, what: str = "directory"):
        self.folder = Path(folder)
        self.path = self.folder / LOCK
        self.what = what
        self.me = identity()

    def __enter__(self) -> DirLock:
        tmp = self._write_temp()
        try:
            try:
                os.link(tmp, self.path)
                return self
            except FileExistsError:
                pass
            with self._guard():
                while True:
                    holder = read_owner(self.path)
                    if holder is not None and alive(holder):
                        raise self.error(f"{self.what} {self.folder} is in use by {describe(holder)}")
                    if self.path.exists():  # stale or garbage; only guarded code removes it
                        os.replace(tmp, self.path)
                        return self
                    try:  # released meanwhile: a fresh take, racing unguarded link()s fairly
                        os.link(tmp, self.path)
                        return self
                    except FileExistsError:
                        continue
        finally:
            Path(tmp).unlink(missing_ok=True)

    def __exit__(self, *exc) -> None:
        with self._guard():
            if read_owner(self.path) == self.me:
                self.path.unlink(missing_ok=True)

    def _write_temp(self) -> str:
        """The owner's line in a temp file beside the lock; a write that fails (a full disk) leaves no temp
        and names the lock file, not its temp copy."""
        tmp = None
        try:
            fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=f"{LOCK}.", suffix=".tmp")
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                os.fchmod(fd, 0o644)  # mkstemp's 0600 would hide the owner from other users of the folder
                f.write(json.dumps(self.me) + "\n")
                f.flush()
                os.fsync(f.fileno())
        except BaseException as err:
            if tmp is not None:
                Path(tmp).unlink(missing_ok=True)
            if isinstance(err, OSError) and (err.filename is None or str(err.filename).endswith(".tmp")):
                err.filename = str(self.path)
            raise
        return tmp

    @contextlib.contextmanager
    def _guard(self):
        """An exclusive flock on the folder itself: serialises takeovers and releases."""
        if fcntl is None:
            yield
            return
        fd = os.open(self.folder, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing the only descriptor releases the flock
