"""OS-level isolation of the children that run uploaded or generated code, with bubblewrap.

Why bubblewrap: one small binary from Debian (package bubblewrap; Flatpak's sandbox) that builds
the namespaces itself (user, mount, PID, network, IPC, UTS, cgroup), with no daemon (Docker and
Podman need one, and neither runs on these machines) and no setuid bit, so it works wherever
unprivileged user namespaces are allowed: a developer's machine, CI (root in a container-like
machine) and the GPU machine (where the binary and its three libraries are carried).

What a child sees (`command`):
- a new root: the system (/usr and its /bin, /lib links), the Python installation, the project
  and the job's own files read-only, a minimal /etc (no shadow file, a passwd that knows the
  sandbox user); its scratch directory is the only writable place (plus what a job must share,
  e.g. the guard's exchange directory), and /tmp is an empty tmpfs;
- /proc of its own PID namespace (it cannot see or signal anything outside), /dev with the
  basics (null, zero, random, urandom, tty, shm) and, for GPU jobs, the NVIDIA device nodes;
- no network at all (a network namespace with only its own loopback: the host's 127.0.0.1
  listeners are unreachable), no capabilities, and an unprivileged user: when the server runs
  as root, the worker drops to uid/gid 65534 (nobody) before it reads a job; otherwise it keeps
  the server's own unprivileged uid inside a user namespace;
- a seccomp filter (x86_64) refusing ptrace, mount, namespace changes, kernel modules, keyrings,
  bpf, perf and the like;
- bubblewrap's --die-with-parent and the PID namespace end every process of the run with it.

When isolation cannot be set up, `status()` says why; uploads are then refused unless the user
sets MTMC_ALLOW_UNISOLATED=1 (the sandbox's rlimits and scrubbed environment still apply).
"""
from __future__ import annotations

import functools
import os
import shutil
import stat
import struct
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

SANDBOX_UID = SANDBOX_GID = 65534
ALLOW_ENV = "MTMC_ALLOW_UNISOLATED"
BWRAP_ENV = "MTMC_BWRAP"          # the bubblewrap binary, when it is not on PATH
INSIDE_ENV = "MTMC_ISOLATED"      # set inside: a nested child is already isolated
_REPO_ROOT = str(Path(__file__).resolve().parents[2])
_ETC_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/localtime", "/etc/nsswitch.conf", "/etc/host.conf")
_GPU_DEVICES = ("nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset", "nvidia-caps")


class IsolationUnavailable(RuntimeError):
    """Uploaded code would run without OS-level isolation, and the user has not allowed that."""


@dataclass(frozen=True)
class Isolation:
    ok: bool
    tool: str | None
    detail: str

    def line(self) -> str:
        if self.ok:
            return f"isolation: on ({self.detail})"
        allowed = " (MTMC_ALLOW_UNISOLATED=1: uploads run anyway)" if unisolated_allowed() else \
            "; uploads are refused (set MTMC_ALLOW_UNISOLATED=1 to run them without it)"
        return f"isolation: OFF: {self.detail}{allowed}"


@dataclass
class Confinement:
    """What one child may see beyond the basics: paths read-only and read-write, the GPU, and a
    directory to share as /dev/shm (CUDA IPC's reference counts live there).

    share_pid: stay in the host's PID namespace.  Legacy CUDA IPC handles cannot cross PID
    namespaces, so the guard's two GPU sessions need it; they then run as a uid of their own
    (`uid`, from fresh_uid()), so nothing else can signal them or read their memory, and every
    process of that uid is killed when the check ends (kill_uid)."""
    ro: list[str] = field(default_factory=list)
    rw: list[str] = field(default_factory=list)
    gpu: bool = False
    shm: str | None = None
    share_pid: bool = False
    uid: int | None = None

    @property
    def user(self) -> int:
        return self.uid or SANDBOX_UID


def unisolated_allowed() -> bool:
    return os.environ.get(ALLOW_ENV, "").lower() in ("1", "true", "yes")


def inside() -> bool:
    return os.environ.get(INSIDE_ENV) == "1"


def bwrap_path() -> str | None:
    given = os.environ.get(BWRAP_ENV)
    return given if given and os.access(given, os.X_OK) else shutil.which("bwrap")


def _drops_user() -> bool:
    return os.geteuid() == 0


DROP_ENV = "MTMC_DROP_TO"   # inside: the uid/gid the worker takes before it reads any job


def drop_privileges() -> None:
    """In the sandboxed worker, first thing: a server running as root runs its children as
    nobody (bubblewrap set up the mounts as root, kept only CAP_SETUID/CAP_SETGID for this, and
    the switch from uid 0 clears every capability)."""
    target = os.environ.get(DROP_ENV)
    if not target:
        return
    uid = int(target)
    if os.getuid() == uid:   # a nested child of the sandbox: already the sandbox user
        return
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    if os.getuid() != uid or os.geteuid() != uid:
        raise SystemExit("could not drop to the sandbox user")
    os.chdir(os.environ["HOME"])   # the scratch: only the sandbox user may enter it


def give_to_sandbox(path: str | Path, uid: int = SANDBOX_UID) -> None:
    """A directory the sandbox user must write (scratch, exchange): owned by it when we drop."""
    if _drops_user():
        os.chown(path, uid, uid)


def fresh_uid() -> int | None:
    """A uid no account and no other sandbox uses (when we drop from root; else None)."""
    import secrets
    return 200000 + secrets.randbelow(100000) if _drops_user() else None


def kill_uid(uid: int | None) -> None:
    """End every process running as a sandbox's own uid (one that left its process group)."""
    if uid is None or uid == SANDBOX_UID or not _drops_user():
        return
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/status") as f:
                real = next(line.split()[1] for line in f if line.startswith("Uid:"))
            if int(real) == uid:
                os.kill(int(entry), 9)
        except (OSError, StopIteration, ValueError):
            continue


# -- the seccomp filter ---------------------------------------------------------------------

# x86_64 system call numbers a kernel-benchmark job never needs and an escape would.
_DENY_X86_64 = {
    "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "mount": 165, "umount2": 166,
    "pivot_root": 155, "chroot": 161, "unshare": 272, "setns": 308, "kexec_load": 246, "kexec_file_load": 320,
    "init_module": 175, "finit_module": 313, "delete_module": 176, "swapon": 167, "swapoff": 168, "reboot": 169,
    "sethostname": 170, "setdomainname": 171, "iopl": 172, "ioperm": 173, "acct": 163, "add_key": 248,
    "request_key": 249, "keyctl": 250, "bpf": 321, "perf_event_open": 298, "userfaultfd": 323,
    "open_by_handle_at": 304, "name_to_handle_at": 303, "quotactl": 179, "lookup_dcookie": 212,
    "fsopen": 430, "fsmount": 432, "move_mount": 429, "open_tree": 428,
}
_AUDIT_ARCH_X86_64 = 0xC000003E
_EPERM = 1


def seccomp_program() -> bytes | None:
    """A classic-BPF seccomp program (bubblewrap's --seccomp format): refuse the calls above
    with EPERM, allow the rest; None on an architecture we have no table for."""
    if os.uname().machine != "x86_64":
        return None
    ld, jeq, ret = 0x20, 0x15, 0x06        # BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_JEQ|BPF_K, BPF_RET|BPF_K
    allow, errno, kill = 0x7FFF0000, 0x00050000 | _EPERM, 0x80000000
    prog = [(ld, 0, 0, 4), (jeq, 1, 0, _AUDIT_ARCH_X86_64), (ret, 0, 0, kill), (ld, 0, 0, 0)]
    # x32 calls (nr >= 0x40000000) would bypass the table: refuse them all
    prog.append((0x35, 0, 1, 0x40000000))   # BPF_JMP|BPF_JGE|BPF_K
    prog.append((ret, 0, 0, errno))
    for nr in sorted(_DENY_X86_64.values()):
        prog += [(jeq, 0, 1, nr), (ret, 0, 0, errno)]
    prog.append((ret, 0, 0, allow))
    return b"".join(struct.pack("HBBI", *ins) for ins in prog)


# -- the command ----------------------------------------------------------------------------

def _covered(path: str, roots: list[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _python_paths() -> list[str]:
    """The Python installation and every import path of this process, outermost first."""
    found = [sys.prefix, sys.base_prefix, sys.exec_prefix, _REPO_ROOT]
    # not this process's working directory (`python -m` puts it on sys.path): the child has its own
    found += [p for p in sys.path if p and os.path.realpath(p) != os.path.realpath(os.getcwd())]
    found += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    out: list[str] = []
    for p in sorted({os.path.realpath(p) for p in found if os.path.exists(p)}, key=len):
        if not _covered(p, out + ["/usr"]):
            out.append(p)
    return out


def _readable_by_others(path: str) -> bool:
    mode = os.stat(path).st_mode
    need = stat.S_IROTH | (stat.S_IXOTH if stat.S_ISDIR(mode) else 0)
    return (mode & need) == need


def _stage(path: str, scratch: Path) -> str:
    """A copy of a file the sandbox user could not read (bound over the original path)."""
    staged = Path(tempfile.mkdtemp(prefix=".staged-", dir=scratch))
    os.chmod(staged, 0o755)
    copy = staged / os.path.basename(path)
    shutil.copy2(path, copy)
    os.chmod(copy, 0o644)
    return str(copy)


def _ro_tree(path: str) -> list[str]:
    """Read-only binds that show a directory of Python code to the sandbox user: the directory
    itself when others may enter it; else (a checkout made by `mktemp -d`, mode 0700) each of its
    entries, the same way, under a directory the new root makes 0755 (_made_dirs).  A worker
    imports modules lazily after it dropped to nobody, so they must stay reachable."""
    if not _drops_user() or not os.path.isdir(path) or _readable_by_others(path):
        return ["--ro-bind", path, path]
    entries = sorted(os.listdir(path))
    if not entries:
        return ["--perms", "0755", "--dir", path]
    return [a for name in entries for a in _ro_tree(os.path.join(path, name))]


def _read_only(path: str, scratch: Path) -> list[str]:
    """Bind arguments showing `path` read-only: a file's whole directory when anyone may read it
    (a module may import its siblings), else the file alone (a copy, when we drop to nobody)."""
    path = os.path.realpath(path)
    if not os.path.exists(path):
        return []
    if os.path.isdir(path) or not _drops_user():
        return ["--ro-bind", path, path]
    folder = os.path.dirname(path)
    if _readable_by_others(folder) and _readable_by_others(path):
        return ["--ro-bind", folder, folder]
    return ["--ro-bind", path if _readable_by_others(path) else _stage(path, scratch), path]


def readable_in_place(path: str | Path) -> bool:
    """Whether a child given a file read-only sees the file's whole folder anyway (`_read_only`:
    when we drop to the sandbox user and anyone may read both), so that showing it that folder
    shows it nothing more; for a folder, whether it would be shown so.  Never without the drop:
    a child keeping our uid is shown the file alone."""
    path = os.path.realpath(path)
    folder = path if os.path.isdir(path) else os.path.dirname(path)
    return (os.path.exists(path) and _drops_user() and _readable_by_others(folder)
            and _readable_by_others(path))


def _etc(scratch: Path, user: int) -> list[str]:
    """A minimal /etc: the loader's cache and a passwd/group that know the sandbox user."""
    etc = scratch / ".etc"
    etc.mkdir(exist_ok=True)
    uid = user if _drops_user() else os.getuid()
    gid = user if _drops_user() else os.getgid()
    (etc / "passwd").write_text(f"sandbox:x:{uid}:{gid}:mtmc sandbox:{scratch}:/usr/sbin/nologin\n")
    (etc / "group").write_text(f"sandbox:x:{gid}:\n")
    args = ["--ro-bind", str(etc / "passwd"), "/etc/passwd", "--ro-bind", str(etc / "group"), "/etc/group"]
    for f in _ETC_FILES:
        args += ["--ro-bind-try", f, f]
    return args


def _system() -> list[str]:
    """/usr and the top-level links or directories that point into it (merged-/usr or not)."""
    args = ["--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    return args


def _made_dirs(args: list[str]) -> list[str]:
    """`--perms 0755 --dir D` for every directory above a mount point that the new root lacks
    (bubblewrap would make them 0700 as root, which the sandbox user cannot enter)."""
    kinds = {"--bind": 2, "--ro-bind": 2, "--ro-bind-try": 2, "--dev-bind-try": 2, "--symlink": 2}
    dests, i = [], 0
    while i < len(args):
        if args[i] in kinds:
            dests.append(args[i + 2])
            i += 3
        else:
            i += 1
    made = ("/usr", "/proc", "/dev", "/sys")       # mounted already, or read-only
    parents = {str(p) for d in dests for p in Path(d).parents
               if str(p) not in ("/", "/tmp", "/run") and not _covered(str(p), list(made))}
    out = []
    for d in sorted(parents, key=lambda p: (p.count("/"), p)):
        out += ["--perms", "0755", "--dir", d]
    return out


def command(argv: list[str], scratch: Path, confine: Confinement, seccomp_fd: int | None) -> list[str]:
    """bubblewrap's command line around `argv` (see the module doc)."""
    # As root, bubblewrap needs no user namespace (it has the rights to mount) and the worker drops
    # to nobody itself (DROP_ENV): a real unprivileged uid, which a user namespace would not give.
    # Otherwise a user namespace, and the child keeps the (unprivileged) user's own uid.
    who = (["--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID",
            "--setenv", DROP_ENV, str(confine.user)] if _drops_user() else ["--unshare-user", "--cap-drop", "ALL"])
    pid = [] if confine.share_pid else ["--unshare-pid"]
    head = [bwrap_path(), *who, *pid, "--unshare-net", "--unshare-ipc", "--unshare-uts",
            "--unshare-cgroup-try", "--die-with-parent", "--new-session", "--hostname", "mtmc-sandbox",
            *_system(), "--proc", "/proc", "--dev", "/dev", "--ro-bind-try", "/sys", "/sys",
            "--perms", "1777", "--tmpfs", "/tmp", "--perms", "0755", "--tmpfs", "/run"]
    args = _etc(scratch, confine.user)
    if confine.gpu:
        for name in sorted(os.listdir("/dev")):
            if name.startswith("nvidia") and (name[6:].isdigit() or name in _GPU_DEVICES):
                args += ["--dev-bind-try", f"/dev/{name}", f"/dev/{name}"]
    for path in _python_paths():
        args += _ro_tree(path)
    for path in confine.ro:
        if not _covered(os.path.realpath(path), _python_paths()):
            args += _read_only(path, scratch)
    for path in [str(scratch), *map(os.path.realpath, confine.rw)]:
        args += ["--bind", path, path]
    if confine.shm:
        args += ["--bind", confine.shm, "/dev/shm"]
    args = head + _made_dirs(args) + args
    if seccomp_fd is not None:
        args += ["--seccomp", str(seccomp_fd)]
    return args + ["--chdir", "/" if _drops_user() else str(scratch), "--setenv", "HOME", str(scratch),
                   "--setenv", "TMPDIR", str(scratch),
                   "--setenv", "USER", "sandbox", "--setenv", INSIDE_ENV, "1", "--", *argv]


@functools.lru_cache(maxsize=1)
def status() -> Isolation:
    """Whether children can be isolated here, tried once with the same command they get."""
    if inside():
        return Isolation(True, None, "already inside a sandbox")
    tool = bwrap_path()
    if tool is None:
        return Isolation(False, None, "bubblewrap (bwrap) is not installed; on Debian/Ubuntu: apt-get install bubblewrap")
    scratch = Path(tempfile.mkdtemp(prefix="mtmc-isolation-probe-"))
    try:
        give_to_sandbox(scratch)
        program = seccomp_program()
        fd = _seccomp_fd(scratch, program)
        try:
            probe = ("import os; from mtmc.tools.isolation import drop_privileges; drop_privileges(); "
                     "open('probe', 'w').write(str(os.getuid()))")
            cmd = command([sys.executable, "-c", probe], scratch, Confinement(), fd)
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": _REPO_ROOT}
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env,
                                 pass_fds=(fd,) if fd is not None else ())
        finally:
            if fd is not None:
                os.close(fd)
        if res.returncode != 0 or not (scratch / "probe").exists():
            why = (res.stderr or res.stdout).strip().splitlines()[-1:] or [f"exit status {res.returncode}"]
            return Isolation(False, tool, f"bubblewrap cannot set up the sandbox here: {why[0][:300]}")
        who = f"uid {(scratch / 'probe').read_text()}" + (" (dropped from root)" if _drops_user() else "")
        extra = "seccomp filter" if program else "no seccomp filter on this architecture"
        spaces = "mount, PID, network, IPC, UTS" if _drops_user() else "user, mount, PID, network, IPC, UTS"
        return Isolation(True, tool, f"bubblewrap: {spaces} namespaces; {who}; {extra}")
    except (OSError, subprocess.SubprocessError) as e:
        return Isolation(False, tool, f"bubblewrap failed to start: {e}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _seccomp_fd(scratch: Path, program: bytes | None) -> int | None:
    if program is None:
        return None
    path = scratch / ".seccomp.bpf"
    path.write_bytes(program)
    return os.open(path, os.O_RDONLY)


def seccomp_fd(scratch: Path) -> int | None:
    """An open file descriptor of the filter for one child (the caller closes it after the start)."""
    return _seccomp_fd(scratch, seccomp_program())


def require(untrusted: bool) -> bool:
    """Whether to isolate a child: True when isolation works; False to run it plainly (generated
    code, or uploads the user allowed unisolated); IsolationUnavailable for uploads otherwise."""
    if inside():
        return False
    st = status()
    if st.ok:
        return True
    if untrusted and not unisolated_allowed():
        raise IsolationUnavailable(f"uploaded code is not run without isolation: {st.detail}. "
                                   f"Set {ALLOW_ENV}=1 to run it anyway, at your own risk.")
    return False
