"""The sandbox's seccomp filter: system calls a notebook never needs, refused with EPERM.

In the spirit of Docker's default profile: no namespaces (unshare, setns, clone with a CLONE_NEW*
flag; clone3, whose flags a filter cannot read, answers ENOSYS so that the C library falls back
to clone), no mounts, no tracing of other processes or reading their memory, no kernel keyring,
BPF, perf events, userfaultfd or io_uring, no modules, kexec, reboot, swap, clock setting,
accounting or quotas, no personality changes. Every other call is allowed; a call of another
architecture's ABI kills the process (libseccomp's default).

The BPF program is built with the system's libseccomp (libseccomp.so.2, through ctypes: four
functions, where its Python bindings need a compiler and its headers, and the PyPI wrapper
around it is unmaintained) and handed to bubblewrap as `--seccomp FD`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import functools
import os
import platform

DENIED = (
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "kcmp",
    "mount",
    "umount",
    "umount2",
    "pivot_root",
    "chroot",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "move_mount",
    "open_tree",
    "mount_setattr",
    "unshare",
    "setns",
    "keyctl",
    "add_key",
    "request_key",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "create_module",
    "open_by_handle_at",
    "name_to_handle_at",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "personality",
    "swapon",
    "swapoff",
    "reboot",
    "clock_settime",
    "clock_adjtime",
    "settimeofday",
    "adjtimex",
    "stime",
    "acct",
    "quotactl",
    "quotactl_fd",
    "lookup_dcookie",
    "syslog",
    "vhangup",
    "iopl",
    "ioperm",
    "uselib",
    "nfsservctl",
    "fanotify_init",
    "lsm_set_self_attr",
)
CLONE_NEW_FLAGS = (
    0x00020000,  # CLONE_NEWNS
    0x00000080,  # CLONE_NEWTIME
    0x02000000,  # CLONE_NEWCGROUP
    0x04000000,  # CLONE_NEWUTS
    0x08000000,  # CLONE_NEWIPC
    0x10000000,  # CLONE_NEWUSER
    0x20000000,  # CLONE_NEWPID
    0x40000000,  # CLONE_NEWNET
)
CLONE_FLAGS_ARG = {"x86_64": 0, "aarch64": 0, "riscv64": 0, "ppc64le": 0, "s390x": 1}
SCMP_ACT_ALLOW = 0x7FFF0000
SCMP_CMP_MASKED_EQ = 7


def _errno_action(code: int) -> int:
    return 0x00050000 | (code & 0xFFFF)


class _ArgCmp(ctypes.Structure):
    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


class SeccompUnavailable(RuntimeError):
    """libseccomp is missing or refused the filter."""


@functools.cache
def _library() -> ctypes.CDLL:
    name = ctypes.util.find_library("seccomp") or "libseccomp.so.2"
    try:
        lib = ctypes.CDLL(name, use_errno=True)
    except OSError as exc:
        raise SeccompUnavailable(
            f"libseccomp is not installed ({exc}; Debian/Ubuntu: apt-get install libseccomp2)"
        ) from exc
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p,
        ctypes.c_uint32,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.POINTER(_ArgCmp),
    ]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    return lib


def syscall_number(name: str) -> int:
    """The native number of the system call `name` (negative where this architecture lacks it)."""
    return int(_library().seccomp_syscall_resolve_name(name.encode("ascii")))


@functools.cache
def program() -> bytes:
    """The filter as the BPF program bubblewrap loads."""
    lib = _library()
    ctx = lib.seccomp_init(SCMP_ACT_ALLOW)
    if not ctx:
        raise SeccompUnavailable("seccomp_init failed")
    try:

        def add(action: int, name: str, *compare: _ArgCmp) -> None:
            number = syscall_number(name)
            if number < 0:
                return  # not a system call of this architecture
            args = (_ArgCmp * len(compare))(*compare) if compare else None
            result = lib.seccomp_rule_add_array(ctx, action, number, len(compare), args)
            if result < 0:
                raise SeccompUnavailable(f"libseccomp refused the rule for {name}: {-result}")

        for name in DENIED:
            add(_errno_action(errno.EPERM), name)
        add(_errno_action(errno.ENOSYS), "clone3")
        arg = CLONE_FLAGS_ARG.get(platform.machine())
        if arg is None:
            add(_errno_action(errno.EPERM), "clone")  # flags at an unknown place: no clone
        else:
            for flag in CLONE_NEW_FLAGS:
                add(
                    _errno_action(errno.EPERM),
                    "clone",
                    _ArgCmp(arg, SCMP_CMP_MASKED_EQ, flag, flag),
                )
        fd = os.memfd_create("seccomp", 0)
        try:
            if lib.seccomp_export_bpf(ctx, fd) < 0:
                raise SeccompUnavailable("libseccomp could not export the filter")
            os.lseek(fd, 0, os.SEEK_SET)
            chunks = []
            while chunk := os.read(fd, 65536):
                chunks.append(chunk)
            return b"".join(chunks)
        finally:
            os.close(fd)
    finally:
        lib.seccomp_release(ctx)


def program_fd() -> int:
    """A new file descriptor (inheritable, at its start) holding the program, for bwrap."""
    fd = os.memfd_create("seccomp", 0)
    os.write(fd, program())
    os.lseek(fd, 0, os.SEEK_SET)
    os.set_inheritable(fd, True)
    return fd
