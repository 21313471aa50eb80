"""The kernel's layers of the sandbox, applied by a process to itself before it runs agent code.

Standard library only: :mod:`worlds._sandbox_child` imports it in a bare ``python -S``. Each
layer is enforced by the kernel and inherited by anything the process starts; none can be
undone later, by Python code or by machine code, which is why the verdicts of
:mod:`worlds.sandbox` rest on these and not on the child's audit hook.

- :func:`limit`: resource limits (CPU seconds, address space, size of any file written, open
  files, no core dumps).
- :func:`landlock` (Linux >= 5.13): reads only of the task directory and the Python
  installation, writes only beneath the task directory, nothing executed; no TCP (ABI >= 4); no
  signals to, or abstract unix sockets of, processes outside (ABI >= 6).
- :func:`seccomp` (x86-64): no sockets, no new processes (threads are allowed), no program
  executed, no signals to other processes, no debugging of others, no new namespaces or mounts,
  no io_uring (it could open sockets past the socket filter).

Each function returns one line saying what it applied, or raises :class:`Unavailable` when the
kernel lacks the feature; any other failure is an :class:`OSError`.
"""

from __future__ import annotations

import ctypes
import errno
import os
import resource
import struct
from collections.abc import Iterable


class Unavailable(Exception):
    """The kernel (or architecture) lacks this layer."""


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return libc


def _no_new_privs(libc: ctypes.CDLL) -> None:
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS: required for both filters
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")


# -- resource limits --------------------------------------------------------------------------


def limit(cpu_seconds: int, memory_mb: int, file_mb: int) -> str:
    mb = 1024 * 1024
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 1))
    resource.setrlimit(resource.RLIMIT_AS, (memory_mb * mb,) * 2)
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_mb * mb,) * 2)
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    return f"cpu {cpu_seconds} s, memory {memory_mb} MB, files {file_mb} MB, 64 open files"


# -- Landlock ---------------------------------------------------------------------------------

_CREATE_RULESET, _ADD_RULE, _RESTRICT_SELF = 444, 445, 446  # the same on every architecture
_EXECUTE, _WRITE_FILE, _READ_FILE, _READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_MAKE = sum(1 << b for b in range(4, 13))  # remove dir/file, make char/dir/reg/sock/fifo/block/sym
_REFER, _TRUNCATE, _IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15  # ABI 2, 3, 5
_SPECIAL = (1 << 6) | (1 << 9) | (1 << 10) | (1 << 11)  # make char/sock/fifo/block: never
_FILE_ONLY = _EXECUTE | _WRITE_FILE | _READ_FILE | _TRUNCATE | _IOCTL_DEV  # valid on a file


class _RulesetAttr(ctypes.Structure):
    _fields_ = (
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    )


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = (("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32))


def landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 where it has none (or has it disabled)."""
    libc = _libc()
    abi = libc.syscall(_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(1))
    return max(int(abi), 0)


def landlock(root: str, readable: Iterable[str], devices: Iterable[str]) -> str:
    """Confine this process: read and write beneath ``root`` (regular files, folders and links:
    no FIFOs, sockets or devices, which could stall or fool the engine's own reads there); read
    ``readable`` paths (files or directories); read and write the character ``devices``
    (``/dev/null``); nothing else."""
    abi = landlock_abi()
    if abi < 1:
        raise Unavailable("landlock: not in this kernel")
    libc = _libc()
    handled = _EXECUTE | _WRITE_FILE | _READ_FILE | _READ_DIR | _MAKE
    handled |= (_REFER if abi >= 2 else 0) | (_TRUNCATE if abi >= 3 else 0)
    handled |= _IOCTL_DEV if abi >= 5 else 0
    attr = _RulesetAttr(handled, 3 if abi >= 4 else 0, 3 if abi >= 6 else 0)
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    ruleset = libc.syscall(_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), 0)
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")

    def allow(path: str, access: int) -> None:
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except FileNotFoundError:
            return
        try:
            if not os.path.isdir(path):
                access &= _FILE_ONLY
            rule = _PathBeneath(access & handled, fd)
            if libc.syscall(_ADD_RULE, ruleset, 1, ctypes.byref(rule), 0) != 0:
                raise OSError(ctypes.get_errno(), f"landlock_add_rule failed for {path}")
        finally:
            os.close(fd)

    try:
        allow(root, handled & ~_EXECUTE & ~_IOCTL_DEV & ~_SPECIAL)
        for path in readable:
            allow(path, _READ_FILE | _READ_DIR)
        for path in devices:
            allow(path, _READ_FILE | _WRITE_FILE | _TRUNCATE)
        _no_new_privs(libc)
        if libc.syscall(_RESTRICT_SELF, ruleset, 0) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
    finally:
        os.close(ruleset)
    done = ["reads only of the task and Python", "writes only in the task", "no programs run"]
    if abi >= 4:
        done.append("no TCP")
    if abi >= 6:
        done.append("no signals or abstract sockets out")
    return f"ABI {abi}: " + ", ".join(done)


# -- seccomp ----------------------------------------------------------------------------------

_AUDIT_ARCH_X86_64 = 0xC000003E
_X32_BIT = 0x40000000
# x86-64 system call numbers (arch/x86/entry/syscalls/syscall_64.tbl).
_DENIED = {
    "socket": 41,
    "socketpair": 53,
    "fork": 57,
    "vfork": 58,
    "execve": 59,
    "ptrace": 101,
    "chroot": 161,
    "mount": 165,
    "umount2": 166,
    "pivot_root": 155,
    "add_key": 248,
    "request_key": 249,
    "keyctl": 250,
    "unshare": 272,
    "perf_event_open": 298,
    "setns": 308,
    "process_vm_readv": 310,
    "process_vm_writev": 311,
    "kcmp": 312,
    "bpf": 321,
    "execveat": 322,
    "userfaultfd": 323,
    "pidfd_send_signal": 424,
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "mount_setattr": 442,
}
_CLONE, _CLONE3, _CLONE_THREAD = 56, 435, 0x00010000
# Signals: allowed only to this process itself (the first argument is its pid or tgid).
_SIGNALLING = {"kill": 62, "rt_sigqueueinfo": 129, "tkill": 200, "tgkill": 234}
_SIGNALLING["rt_tgsigqueueinfo"] = 297

_LD_W_ABS, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_RET_KILL_PROCESS, _RET_ALLOW, _RET_ERRNO = 0x80000000, 0x7FFF0000, 0x00050000
_NR, _ARCH, _ARG0 = 0, 4, 16  # offsets in struct seccomp_data (arguments: their low half)


class _Filter(ctypes.Structure):
    _fields_ = (("len", ctypes.c_ushort), ("filter", ctypes.c_char_p))


def _program(own_pid: int) -> bytes:
    """The BPF program: a list of (code, jump if true, jump if false, constant)."""
    deny, nosys = _RET_ERRNO | errno.EPERM, _RET_ERRNO | errno.ENOSYS
    prog: list[tuple[int, int, int, int]] = [
        (_LD_W_ABS, 0, 0, _ARCH),
        (_JEQ, 1, 0, _AUDIT_ARCH_X86_64),
        (_RET, 0, 0, _RET_KILL_PROCESS),  # another ABI's numbers mean other calls
        (_LD_W_ABS, 0, 0, _NR),
        (_JGE, 0, 1, _X32_BIT),
        (_RET, 0, 0, deny),  # the x32 ABI: the same calls under other numbers
    ]
    for nr in _DENIED.values():
        prog += [(_JEQ, 0, 1, nr), (_RET, 0, 0, deny)]
    # clone3 passes its flags in memory a filter cannot read: libc falls back to clone.
    prog += [(_JEQ, 0, 1, _CLONE3), (_RET, 0, 0, nosys)]
    prog += [
        (_JEQ, 0, 4, _CLONE),
        (_LD_W_ABS, 0, 0, _ARG0),
        (_JSET, 1, 0, _CLONE_THREAD),  # a thread of this process: allowed
        (_RET, 0, 0, deny),
        (_RET, 0, 0, _RET_ALLOW),
    ]
    for nr in _SIGNALLING.values():
        prog += [
            (_JEQ, 0, 4, nr),
            (_LD_W_ABS, 0, 0, _ARG0),
            (_JEQ, 0, 1, own_pid),
            (_RET, 0, 0, _RET_ALLOW),
            (_RET, 0, 0, deny),
        ]
    prog.append((_RET, 0, 0, _RET_ALLOW))
    return b"".join(struct.pack("=HBBI", *insn) for insn in prog)


def seccomp() -> str:
    """Install the system-call filter (x86-64 only: the numbers are the architecture's)."""
    machine = os.uname().machine
    if machine != "x86_64":
        raise Unavailable(f"seccomp: no filter written for {machine}")
    libc = _libc()
    code = _program(os.getpid())
    prog = _Filter(len(code) // 8, code)
    _no_new_privs(libc)
    if libc.prctl(22, 2, ctypes.byref(prog), 0, 0) != 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
        err = ctypes.get_errno()
        if err == errno.EINVAL:
            raise Unavailable("seccomp: not in this kernel")
        raise OSError(err, "prctl(PR_SET_SECCOMP) failed")
    return "no sockets, processes, programs, signals out, ptrace, namespaces, mounts, io_uring"
