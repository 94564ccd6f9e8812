"""The sandbox's seccomp filter (agentrft.sandbox): the system calls that graders and test
runs never need and that open the kernel's larger attack surfaces, refused with EPERM. Built
with libseccomp (through `pyseccomp`) and compiled to the BPF program that `bwrap --seccomp
FD` loads just before it starts the sandboxed program.

The list follows Flatpak's filter (made for bubblewrap) and Docker's default profile:
debugging other processes, mounts, new namespaces, kernel keyrings, eBPF, perf events,
userfaultfd and io_uring (where many kernel exploits start), modules, kexec, clocks, swap
and accounting. `clone3` answers ENOSYS, so the C library falls back to `clone`, whose
flags a filter can read (clone3 passes them in memory): a thread or a fork works, a clone
into new namespaces is refused. Other system-call ABIs (i386, x32) kill the process.

Started by root, the sandbox makes its own user namespace after it becomes the sandbox uid,
so `unshare` is refused by a second filter (`UNSHARE`) that it loads itself right after.
"""

from __future__ import annotations

import errno
import functools
import tempfile
from typing import Any

# refused with EPERM
DENIED = (
    # other processes' memory and execution
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    # mounts and the root directory
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "open_tree",
    "move_mount",
    "mount_setattr",
    # joining namespaces (new ones: `unshare` below and `clone`'s flags)
    "setns",
    # kernel keyrings
    "keyctl",
    "add_key",
    "request_key",
    # eBPF, perf events, userfaultfd, io_uring
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    # the kernel itself, the clocks, swap, accounting and the kernel log
    "init_module",
    "finit_module",
    "delete_module",
    "kexec_load",
    "kexec_file_load",
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "quotactl",
    "syslog",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "iopl",
    "ioperm",
    "open_by_handle_at",
    "name_to_handle_at",
    "vhangup",
)
UNSHARE = "unshare"
# clone(2) flags that make a new namespace
CLONE_NAMESPACES = {
    "CLONE_NEWNS": 0x00020000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
    "CLONE_NEWTIME": 0x00000080,
}


@functools.cache
def _library() -> Any:
    """pyseccomp, or an ImportError saying why it cannot load (it needs libseccomp.so.2)."""
    try:
        import pyseccomp
    except (ImportError, RuntimeError, OSError) as exc:  # RuntimeError: no libseccomp.so.2
        raise ImportError(
            f"no seccomp filter: {exc}. Install it: pip install pyseccomp; apt-get install libseccomp2"
        ) from None
    return pyseccomp


def unavailable() -> str | None:
    """Why no filter can be built here, or None when one can."""
    try:
        _library()
    except ImportError as exc:
        return str(exc)
    return None


@functools.cache
def program(*, unshare: bool = True) -> bytes:
    """The filter as a BPF program (an array of `struct sock_filter`). `unshare=False` leaves
    `unshare` allowed, for a sandbox that loads `unshare_program()` after its own."""
    sc = _library()
    f = sc.SyscallFilter(sc.ALLOW)
    refuse = sc.ERRNO(errno.EPERM)
    for name in DENIED + ((UNSHARE,) if unshare else ()):
        f.add_rule(refuse, name)
    for flag in CLONE_NAMESPACES.values():  # clone's flags are its first argument on x86-64
        f.add_rule(refuse, "clone", sc.Arg(0, sc.MASKED_EQ, flag, flag))
    f.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    return _compiled(f)


@functools.cache
def unshare_program() -> bytes:
    """A filter that refuses `unshare` alone (the second one of a sandbox started by root)."""
    sc = _library()
    f = sc.SyscallFilter(sc.ALLOW)
    f.add_rule(sc.ERRNO(errno.EPERM), UNSHARE)
    return _compiled(f)


def _compiled(f: Any) -> bytes:
    with tempfile.TemporaryFile() as out:
        f.export_bpf(out)
        out.seek(0)
        return out.read()
