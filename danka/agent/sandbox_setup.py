"""Run as a script (``python -I -S sandbox_setup.py SPEC_JSON``): enter fresh Linux
namespaces, build a root that holds only what the interpreter needs, then exec the
snippet there. Standard library only; nothing of danka is importable at that point.

Steps (sandbox.py chose this mode and wrote SPEC_JSON):

1. ``unshare`` mount, network, IPC, UTS and PID namespaces (as real root directly; as
   anyone else, or as a root without CAP_SYS_ADMIN, inside a new user namespace that maps
   only the caller's own uid to 0);
2. fork: the child is PID 1 of the new PID namespace (when it exits the kernel kills
   every process left in it) and gets SIGKILL if this process dies (a timeout kill);
3. in the child: a tmpfs becomes the new root; read-only bind mounts of the interpreter's
   prefix, /usr, /lib* and /etc/ld.so.cache; /dev/null, zero, full, random, urandom; the
   snippet's own temporary folder as /tmp, the only writable place; a new /proc showing
   only the sandbox; ``pivot_root`` into it and the old root detached (unlike chroot,
   nothing of it is reachable);
4. privileges dropped: a real root becomes ``nobody``; inside a user namespace every
   capability is dropped; no new privileges either way;
5. rlimits (CPU seconds, address space, file size, processes, no core files), then exec
   ``python -I -c CODE`` with an environment of PATH, LANG, HOME=/tmp and TMPDIR=/tmp.

Any failure before the exec prints ``danka-sandbox: ...`` and exits with code 125.
"""

from __future__ import annotations

import ctypes
import json
import os
import platform
import resource
import signal
import sys

CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC = 0x00020000, 0x04000000, 0x08000000
CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x10000000, 0x20000000, 0x40000000
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21
MNT_DETACH = 2
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS, PR_CAPBSET_DROP = 1, 38, 24
SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}
DEVICES = ("null", "zero", "full", "random", "urandom")
EXIT_SETUP = 125

_libc = ctypes.CDLL(None, use_errno=True)


class SetupError(Exception):
    pass


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise SetupError(f"{what}: {os.strerror(err)} (errno {err})")


def _mount(src: str | None, dst: str, fstype: str | None, flags: int, data: str | None = None):
    enc = [None if x is None else x.encode() for x in (src, dst, fstype, data)]
    _check(_libc.mount(enc[0], enc[1], enc[2], ctypes.c_ulong(flags), enc[3]), f"mount {dst}")


def _write(path: str, text: str) -> None:
    with open(path, "w") as f:
        f.write(text)


def enter_namespaces() -> bool:
    """Step 1; returns True when a user namespace was needed (not a real, capable root)."""
    flags = CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWPID
    if os.geteuid() == 0 and _libc.unshare(flags) == 0:
        return False
    uid, gid = os.geteuid(), os.getegid()
    _check(_libc.unshare(flags | CLONE_NEWUSER), "unshare (user namespace)")
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"0 {uid} 1")
    _write("/proc/self/gid_map", f"0 {gid} 1")
    return True


def _locked_flags(path: str) -> int:
    """The flags of the mount holding ``path`` that a bind remount must keep (a user
    namespace may not clear them: EPERM otherwise)."""
    f = os.statvfs(path).f_flag
    out = 0
    for st, ms in (
        (1, MS_RDONLY),
        (2, MS_NOSUID),
        (4, MS_NODEV),
        (8, MS_NOEXEC),
        (1024, MS_NOATIME),
        (2048, MS_NODIRATIME),
        (4096, MS_RELATIME),
    ):
        if f & st:
            out |= ms
    return out


def _bind(src: str, dst: str, *, writable: bool = False) -> None:
    if os.path.isdir(src):
        os.makedirs(dst, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        open(dst, "a").close()
    _mount(src, dst, None, MS_BIND | MS_REC)
    flags = MS_REMOUNT | MS_BIND | _locked_flags(src) | MS_NOSUID | MS_NODEV
    _mount(None, dst, None, flags if writable else flags | MS_RDONLY)


def build_root(spec: dict) -> None:
    """Step 3: the new root, then ``pivot_root`` into it."""
    root = spec["root"]
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing we mount leaks to the host
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=4m,mode=0755")
    for src in spec["read_only"]:
        dst = root + src
        if os.path.islink(src):  # /lib -> usr/lib on merged-/usr systems
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            os.symlink(os.readlink(src), dst)
        elif os.path.exists(src):
            _bind(src, dst)
    for name in DEVICES:
        dst = f"{root}/dev/{name}"
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        open(dst, "a").close()
        _mount(f"/dev/{name}", dst, None, MS_BIND)
    _bind(spec["work"], f"{root}/tmp", writable=True)
    os.makedirs(f"{root}/proc", exist_ok=True)
    try:
        _mount("proc", f"{root}/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    except SetupError:
        pass  # python needs no /proc; it only shows the sandbox's own processes
    os.chdir(root)
    number = SYS_PIVOT_ROOT.get(platform.machine())
    if number is None:
        raise SetupError(f"pivot_root: unknown syscall number on {platform.machine()}")
    _check(_libc.syscall(number, b".", b"."), "pivot_root")
    _check(_libc.umount2(b".", MNT_DETACH), "detach the old root")
    os.chdir("/")
    _mount("tmpfs", "/", "tmpfs", MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.chdir("/tmp")


def drop_privileges(in_userns: bool, nobody: tuple[int, int]) -> None:
    """Step 4."""
    if not in_userns:
        os.setgroups([])
        os.setgid(nobody[1])
        os.setuid(nobody[0])
    else:
        for cap in range(64):
            _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)

        class Header(ctypes.Structure):
            _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

        class Data(ctypes.Structure):
            _fields_ = [
                ("effective", ctypes.c_uint32),
                ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32),
            ]

        header, data = Header(0x20080522, 0), (Data * 2)()  # _LINUX_CAPABILITY_VERSION_3
        _check(_libc.capset(ctypes.byref(header), data), "drop capabilities")
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")


def processes_of(uid: int) -> int:
    """How many processes ``uid`` runs (the host's /proc): RLIMIT_NPROC counts them all."""
    n = 0
    try:
        names = os.listdir("/proc")
    except OSError:
        return 0
    for name in names:
        try:
            n += name.isdigit() and os.stat(f"/proc/{name}").st_uid == uid
        except OSError:
            pass
    return n


def set_limits(spec: dict, running: int | None = None) -> None:
    """Step 5 (also used by the other modes, between fork and exec). ``running``: the
    processes the final uid already has (counted here when None); the snippet may start
    ``spec["extra_processes"]`` more."""
    cpu, mem, fsize = spec["cpu_s"], spec["memory"], spec["file_size"]
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    nproc = (processes_of(os.getuid()) if running is None else running) + spec["extra_processes"]
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))


def _exit_status(status: int) -> int:
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def main() -> int:
    spec = json.loads(sys.argv[1])
    try:
        in_userns = enter_namespaces()
    except (SetupError, OSError) as err:
        print(f"danka-sandbox: {err}", file=sys.stderr)
        return EXIT_SETUP
    pid = os.fork()
    if pid:  # outside the PID namespace: wait for its init, pass its status on
        return _exit_status(os.waitpid(pid, 0)[1])
    try:
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        nobody = tuple(spec["nobody"])
        running = processes_of(os.geteuid() if in_userns else nobody[0])  # host-wide
        if not in_userns:  # the snippet runs as nobody: its /tmp must be nobody's
            os.chown(spec["work"], *nobody)
        build_root(spec)
        drop_privileges(in_userns, nobody)
        set_limits(spec, running)
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": "/tmp", "TMPDIR": "/tmp"}
        os.execve(spec["python"], [spec["python"], "-I", "-c", spec["code"]], env)
    except (SetupError, OSError) as err:
        print(f"danka-sandbox: {err}", file=sys.stderr, flush=True)
    os._exit(EXIT_SETUP)


if __name__ == "__main__":
    sys.exit(main())
