r"""Sandbox: run designer-written environments and model-written programs in locked-down processes.

SPADE (arXiv 2608.19197, Sec. 3): the Environment Designer writes a Python class with reset() and
step() (games) or a ToolEnv subclass (tool use, Sec. 4.2) for the Reasoning Agent to play; eval runs
model-written LiveCodeBench solutions: untrusted code, run by the thousand next to weights and keys.

    with Sandbox(workers=8, step_timeout=5.0, memory_mb=1024) as sb:
        report = sb.validate(source, setting="games")  # ValidationReport: ok error class_name kind
        env = sb.open(source)                 # EnvHandle: reset(seed) step(action) tools() close()
        env.load(); env.call("S", action)     # the same, raising FaultError (validate's probe)
        sb.reset_many(handles, seeds); sb.step_many(handles, actions)  # handles run concurrently
        status, stdout = sb.run_program(code, stdin, timeout=6.0)

Needs: sandbox.py alone for games and programs; + toolenv.py beside it for tool use (the zygote
preloads it when present; without it the "tool" setting raises SandboxInfraError). Stdlib only.

THREAT MODEL. The code may hang, ignore signals, bomb memory, processes or threads, flood output,
read env vars, home secrets or project files, write anywhere, open sockets, signal or ptrace the
trainer, forge or add reply lines, return lying objects (float/str subclasses, NaN, a faked
__class__, lone surrogates), exit or segfault, keep state for its next episode, and behave well
only while validated. None of that may crash or stall the caller, leak a secret, leave a side
effect, or change another episode.

DESIGN. A zygote (`python -s -B -P sandbox.py --zygote`, clean env, never a fork of the trainer,
never runs untrusted code) forks one worker per EPISODE (`pool` of them ahead); a worker locks
itself down before it reads its first request, then executes the source afresh, in a namespace
where the authors' loader's standard-library names (COMMON_NAMES) are already bound. Requests and
replies are JSON lines on two private pipes, one request outstanding (a _Call), each with a fresh
nonce; the PARENT re-checks every reply field with type(), caps and text checks (check_reset,
check_step: pure, and reused for environments played outside the sandbox). An environment fault
is named by its kind (FAULT_KINDS) and reaches the caller as a result, Fault.of(kind, message),
or a ValidationReport's kind; a failure of the sandbox itself raises SandboxInfraError.
LAYERS (`Sandbox.layers` lists those achieved; a later worker missing one exits unused):
  always    allow-listed env (PYTHONHASHSEED=0), setsid, fds 0-2 on /dev/null, pipes on 3/4, no
            other fd, scratch cwd; rlimits AS (memory_mb above the preloaded zygote), CPU, FSIZE,
            NOFILE, NPROC, CORE=0; parent deadlines per call and per episode, SIGKILL of the
            process group; JSON only (never pickle), 1 MiB reply lines; a fresh worker per episode.
  netns     (root) one empty network namespace for the zygote's workers, only loopback; workers
            cannot reach each other there (no TCP/UDP: see landlock and seccomp).
  mountns   (root) private size-capped tmpfs on /tmp, /var/tmp, /dev/shm (scratch lives there;
            with own_scratch, each worker's scratch is a tmpfs of its own, in its own namespace).
  uid       (root) one unprivileged uid per worker: no signal, ptrace, renice or /proc read across
            workers or towards the trainer; the trainer user's files stay closed.
  pdeathsig, nondumpable, no_new_privs   set after the uid drop.
  landlock  reads only below the Python install and system libraries, writes only in its scratch
            dir, no TCP bind/connect; abstract unix sockets and signals scoped to it (ABI >= 6).
  seccomp   BPF (x86_64, aarch64; _DENY by name): EPERM for fork, exec, ptrace, mount, namespaces,
            bpf, io_uring, modules, pidfd, setpriority, ...; clone only with CLONE_THREAD;
            kill/sigqueue only of itself; sockets only AF_UNIX.
NOT COVERED. Kernel exploits (a process sandbox is not a VM); GPU device nodes are visible
(Landlock forbids opening them); no cgroups (workers share CPU and memory within their rlimits);
below Landlock ABI 6 (Linux 6.12) abstract unix sockets are not scoped, so workers of one zygote
could meet there. Without root, scratch is the host's /tmp under the per-file limit and workers
share the trainer's uid, relying on Landlock and seccomp; without those too, only "always" holds
and world-readable files and the network are reachable. A worker may read the nonce from its own
serve loop and answer for itself: that only changes its own reply.

DEVIATIONS: 1. A process per episode (authors: exec() inside the trainer, thread timeouts): module
globals, class attributes, `random` and stdlib state never carry over. 2. Validation adds an
unpredictable probe (random seed and actions) under the play-time limits, runs toolenv.self_check
from seeds 0, 1, 2 for a tool environment, and rejects `too_slow`: a median reset or step call over
SLOW_SHARE x step_timeout (it would stall every batched turn). 3. Threads are allowed; one left
running at reset, episode end or in validation is a `resource_leak`. 4. Conveniences: a bare-str
reset() is (obs, {}); the worker converts numpy values; observations are cut at OBS_CAP characters.
5. An exactly empty reset observation is `invalid_observation` at every reset (authors: at the
seed-42 reset their load runs before validation and every play); a whitespace one passes.
The environment is the LAST module-level class whose name ends in "Env", built with no arguments,
or with max_turns=Sandbox.max_turns when that raises TypeError (as the authors' play builds it).
Test: python -m pytest -q tests/test_sandbox.py tests/test_sandbox_alone.py
"""
from __future__ import annotations

import contextlib
import ctypes
import fcntl
import gc
import json
import math
import os
import random
import resource
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import NoReturn

# The observation cap in characters; honest observations up to this pass unchanged.
OBS_CAP = 32_000
LINE_CAP = 1 << 20      # bytes per reply line (environments)
# Validation: the largest median reset/step time, as a share of step_timeout.
SLOW_SHARE = 0.25
# The paper's fixed probe actions.
PROBE_ACTIONS = (r"\boxed{1}", r"\boxed{test}", r"\boxed{42}")
# The kinds of environment fault: every one the caller sees is named by one of these.
FAULT_KINDS = ("load_error", "reset_error", "step_error", "timeout", "episode_timeout",
               "memory_limit", "cpu_limit", "worker_exited", "worker_crashed",
               "protocol_violation", "output_too_large", "invalid_observation", "invalid_reward",
               "invalid_result", "resource_leak", "nondeterministic", "unsolvable", "too_slow",
               "closed")
# Worker uids: a zygote takes block (its pid % UID_BLOCKS) of UIDS uids above UID_BASE (past any
# uid a system hands out), one for each live or pre-forked worker.
UID_BASE = 0x10000000
UID_BLOCKS = 0x100000
UIDS = 0x400
FULL = ("rlimits", "netns", "uid", "pdeathsig", "nondumpable", "no_new_privs", "seccomp")
# A worker's rlimits besides memory, CPU and file size: open fds, and tasks of its uid (threads
# count). As root the uid is the worker's own; without root it is the trainer's, and the limit 0.
WORKER_FDS = 64
WORKER_TASKS = 32
# Imported by the zygote: workers have them even without read access.
PRELOAD = tuple(
    "math random re json itertools collections functools heapq string fractions decimal "
    "statistics dataclasses typing enum copy textwrap bisect operator datetime hashlib array "
    "struct time unicodedata abc numbers pprint traceback types ast tempfile shutil ctypes "
    "resource fcntl threading calendar cmath difflib uuid secrets io queue".split())
# Also preloaded, if installed and numpy=True.
NUMPY_PRELOAD = ("numpy", "numpy.random", "numpy.linalg")
# The names the authors' loader binds in every environment's namespace before its code runs, so a
# game that uses one without importing it still loads: name -> "module" or "module.attribute".
# Each is bound to what the game's own `import` would give it (all in PRELOAD); the game may rebind
# any of them. np / numpy too when the zygote preloaded numpy (numpy=True and installed).
COMMON_NAMES = {
    **{m: m for m in ("math random re json collections itertools functools string copy heapq "
                      "operator statistics").split()},
    **{n: "collections." + n for n in "deque defaultdict Counter OrderedDict namedtuple".split()},
    **{n: "itertools." + n for n in "combinations permutations product chain accumulate".split()},
    "reduce": "functools.reduce", "lru_cache": "functools.lru_cache",
    "deepcopy": "copy.deepcopy", "heappush": "heapq.heappush", "heappop": "heapq.heappop",
    **{n: "typing." + n for n in ("Tuple Dict List Optional Union Any Set FrozenSet Callable "
                                  "Iterable Sequence Mapping").split()}}
NUMPY_NAMES = {"np": "numpy", "numpy": "numpy"}

# INFRA: the kernel's numbers this module passes to libc, from the Linux uapi headers (the same on
# x86_64 and aarch64; the seccomp tables below hold the per-arch syscall numbers).
# prctl(2) options (linux/prctl.h), and seccomp's filter mode (linux/seccomp.h).
PR_SET_PDEATHSIG = 1        # arg: the signal the process gets when its parent dies
PR_SET_DUMPABLE = 4         # arg 0: no core dump, no ptrace attach, /proc/<pid> owned by root
PR_SET_SECCOMP = 22
SECCOMP_MODE_FILTER = 2     # PR_SET_SECCOMP's mode: a BPF program
PR_SET_NO_NEW_PRIVS = 38    # arg 1: no exec can ever grant privileges (setuid bits, file caps)
# clone(2) / unshare(2) flags (linux/sched.h).
CLONE_THREAD = 0x00010000   # a thread of this process, not a new process
CLONE_NEWNS = 0x00020000    # a new mount namespace
CLONE_NEWNET = 0x40000000   # a new network namespace
# mount(2) flags (linux/mount.h).
MS_NOSUID = 0x2             # setuid bits and file caps mean nothing there
MS_NODEV = 0x4              # device nodes there cannot be opened
MS_REC = 0x4000             # with MS_PRIVATE: the whole tree below
MS_PRIVATE = 0x40000        # mounts no longer propagate to or from the parent namespace
# Landlock (linux/landlock.h): its syscalls (asm-generic numbers, on both arches), its flags, and
# the filesystem rights this module grants.
SYS_LANDLOCK_CREATE_RULESET = 444
SYS_LANDLOCK_ADD_RULE = 445
SYS_LANDLOCK_RESTRICT_SELF = 446
LANDLOCK_CREATE_RULESET_VERSION = 1  # create_ruleset's flag: return the ABI version instead
LANDLOCK_RULE_PATH_BENEATH = 1
LANDLOCK_ACCESS_FS_EXECUTE = 0x1
LANDLOCK_ACCESS_FS_READ_FILE = 0x4
LANDLOCK_ACCESS_FS_READ_DIR = 0x8
# Every filesystem right an ABI knows, by ABI (a handled right is denied unless a rule grants it):
# ABI 1 has 13 (EXECUTE .. MAKE_SYM), 2 adds REFER, 3 TRUNCATE, 5 IOCTL_DEV; 4 and later none.
LANDLOCK_FS_RIGHTS = {1: 0x1FFF, 2: 0x3FFF, 3: 0x7FFF, 4: 0x7FFF, 5: 0xFFFF}
LANDLOCK_ABI_NET = 4        # the first ABI with network rights: handled, so denied
LANDLOCK_NET_RIGHTS = 0x3   # BIND_TCP | CONNECT_TCP
LANDLOCK_ABI_SCOPED = 6     # the first ABI with scopes: these IPC only within its own domain
LANDLOCK_SCOPED = 0x3       # ABSTRACT_UNIX_SOCKET | SIGNAL

# INFRA: the wire format: one JSON value per line, ASCII, no NaN/inf, never pickle. A request is
# <op><nonce><JSON>, a reply <nonce>REPLY_OK<JSON result> or <nonce>REPLY_FAULT<JSON [kind,
# message]>; a fresh worker writes WORKER_READY once, before its first reply, when set up.
REQUEST_FD = 3              # the worker's end of the request pipe
REPLY_FD = 4                # the worker's end of the reply pipe
NONCE_LEN = 8               # hex digits: 32 bits from the parent's private RNG
REPLY_OK = b"="
REPLY_FAULT = b"!"
WORKER_READY = b"+"
# A worker's own exit statuses: a required layer is missing (it fails closed), or its set-up or
# serve loop raised (it never returns into the zygote's code).
EXIT_FAIL_CLOSED = 71
EXIT_NEVER_RETURN = 70


def _jsonable(x):
    """Honest non-JSON values in results: numpy values as lists/numbers, sets sorted, else str()."""
    if type(x).__module__.split(".")[0] == "numpy" and hasattr(x, "tolist"):
        return x.tolist()
    return sorted(x, key=repr) if isinstance(x, (set, frozenset)) else str(x)


_dumps = json.JSONEncoder(allow_nan=False, separators=(",", ":"), default=_jsonable).encode
# A str as a JSON string: json's C function.
_quote = json.encoder.encode_basestring_ascii
# json's C scanner (decode() adds 2 frames); parse_constant=int: int("NaN") raises
_scan = json.JSONDecoder(parse_constant=int).scan_once


def _loads(text: str):
    """Strict JSON: one value, nothing after it (ValueError, or StopIteration: no value at all)."""
    obj, end = _scan(text, 0)
    if end != len(text):
        raise ValueError("data after the JSON value")
    return obj


class SandboxInfraError(RuntimeError):
    """The sandbox itself failed or cannot serve the request (never the environment's fault)."""


@dataclass
class ValidationReport:
    ok: bool
    error: str | None = None  # "<kind>: <short message>" when not ok
    class_name: str | None = None
    kind: str | None = None   # the fault's kind when not ok (one of FAULT_KINDS), else None


class Fault(tuple):
    """An environment fault as the reset or step result the caller gets, never a raise: the error
    observation's items, (obs, 0.0, True, False, {}) for a step or (obs, {}) for a reset, with its
    `kind` (one of FAULT_KINDS) and `message`. Built by Fault.of only, never from a reply: every
    reply becomes a plain tuple, and an info's "error" key is the environment's own. A reader
    recognises one by its `fault` attribute, the kind: `getattr(result, "fault", None)` is None for
    any other result (agent.fault reads it so, without importing this module)."""

    kind: str
    message: str

    @classmethod
    def of(cls, kind: str, message: str = "", *, step: bool) -> Fault:
        """The Fault result of a step (step=True) or a reset; the message shortened, printable."""
        message = clean_message(message)
        obs = f"[environment error: {kind}] {message}"
        fault = cls((obs, 0.0, True, False, {}) if step else (obs, {}))
        fault.kind, fault.message = kind, message
        return fault

    @classmethod
    def of_error(cls, e: Exception, kind: str, *, step: bool) -> Fault:
        """The Fault result of exception e caught outside a worker (imported.py, openenv.py): a
        FaultError (our own checks) names its kind; any other exception, whatever attributes it
        carries, is `kind` and says its type."""
        if isinstance(e, FaultError):
            return cls.of(e.kind, e.message, step=step)
        return cls.of(kind, f"{type(e).__name__}: {e}", step=step)

    @property
    def fault(self) -> str:
        return self.kind


class FaultError(Exception):
    """An environment fault, raised where it is found (a check, the worker's own code, a deadline)
    and turned into a Fault result where the caller gets one: `kind` (one of FAULT_KINDS) and
    `message`, shortened and printable."""

    def __init__(self, kind: str, message: str = ""):
        super().__init__(message)
        self.kind, self.message = kind, clean_message(message)


# INFRA: kernel layers applied in the worker (ctypes + stdlib only). Syscall numbers as
# (x86_64, aarch64) from asm/unistd_64.h and asm-generic/unistd.h; None: the arch has no such call.
# Calls whose arguments are checked; audit is the AUDIT_ARCH_* value, not a call.
_ARGS = dict(clone=(56, 220), clone3=(435, 435), kill=(62, 129), tgkill=(234, 131),
             rt_sigqueueinfo=(129, 138), rt_tgsigqueueinfo=(297, 240), socket=(41, 198),
             socketpair=(53, 199), audit=(0xC000003E, 0xC00000B7))
# Calls denied with EPERM whatever the arguments.
_DENY = dict(
    ptrace=(101, 117), process_vm_readv=(310, 270), process_vm_writev=(311, 271), fork=(57, None),
    vfork=(58, None), tkill=(200, 130), execve=(59, 221), execveat=(322, 281), unshare=(272, 97),
    setns=(308, 268), mount=(165, 40), umount2=(166, 39), pivot_root=(155, 41), chroot=(161, 51),
    bpf=(321, 280), perf_event_open=(298, 241), userfaultfd=(323, 282), keyctl=(250, 219),
    add_key=(248, 217), request_key=(249, 218), kexec_load=(246, 104), init_module=(175, 105),
    kexec_file_load=(320, 294), finit_module=(313, 273), delete_module=(176, 106),
    reboot=(169, 142), swapon=(167, 224), swapoff=(168, 225), acct=(163, 89),
    personality=(135, 92), open_by_handle_at=(304, 265), name_to_handle_at=(303, 264),
    sethostname=(170, 161), setdomainname=(171, 162), quotactl=(179, 60), kcmp=(312, 272),
    iopl=(172, None), ioperm=(173, None), setpriority=(141, 140),
    # Then the calls since Linux 5.1, whose numbers both arches share.
    pidfd_send_signal=(424, 424), io_uring_setup=(425, 425), io_uring_enter=(426, 426),
    io_uring_register=(427, 427), open_tree=(428, 428), move_mount=(429, 429),
    fsopen=(430, 430), fsconfig=(431, 431), fsmount=(432, 432), pidfd_open=(434, 434),
    pidfd_getfd=(438, 438), process_madvise=(440, 440), mount_setattr=(442, 442))
_SYSCALLS = {arch: dict({k: v[i] for k, v in _ARGS.items()},
                        deny={k: v[i] for k, v in _DENY.items() if v[i] is not None})
             for i, arch in enumerate(("x86_64", "aarch64"))}
_ARCH = os.uname().machine
# Classic BPF opcodes (LD|W|ABS, JMP|...), then the SECCOMP_RET_* actions.
_LD, _JEQ, _JSET, _JGE, _RET = 0x20, 0x15, 0x45, 0x35, 0x06
_ALLOW, _EPERM, _ENOSYS, _KILL = 0x7FFF0000, 0x50001, 0x50026, 0x80000000
# Byte offsets in struct seccomp_data: the syscall number, the AUDIT_ARCH_* value, the low half of
# the first argument (both arches are little-endian).
SECCOMP_DATA_NR = 0
SECCOMP_DATA_ARCH = 4
SECCOMP_DATA_ARG0 = 16
# x86_64 syscall numbers with this bit set are the x32 ABI's (asm/unistd.h __X32_SYSCALL_BIT).
X32_SYSCALL_BIT = 0x40000000
# struct sock_filter: code, jt, jf, k.
SOCK_FILTER = "HBBI"


def _only(nr, values) -> list:
    """Allow syscall `nr` iff the low 32 bits of its first argument are in `values`, else EPERM."""
    body = [(_LD, 0, 0, SECCOMP_DATA_ARG0)]
    body += [(_JEQ, len(values) - j, 0, v & 0xFFFFFFFF) for j, v in enumerate(values)]
    return [(_JEQ, 0, len(body) + 2, nr)] + body + [(_RET, 0, 0, _EPERM), (_RET, 0, 0, _ALLOW)]


def _seccomp_head(arch: str) -> bytes:
    """BPF over seccomp_data {nr@0, arch@4, args@16+8i} but the pid tail; another arch is killed."""
    nr = _SYSCALLS[arch]
    prog = [(_LD, 0, 0, SECCOMP_DATA_ARCH), (_JEQ, 1, 0, nr["audit"]), (_RET, 0, 0, _KILL),
            (_LD, 0, 0, SECCOMP_DATA_NR)]
    if arch == "x86_64":
        prog += [(_JGE, 0, 1, X32_SYSCALL_BIT), (_RET, 0, 0, _EPERM)]
    for number in nr["deny"].values():
        prog += [(_JEQ, 0, 1, number), (_RET, 0, 0, _EPERM)]
    # clone3 gets ENOSYS: glibc falls back to clone.
    prog += [(_JEQ, 0, 1, nr["clone3"]), (_RET, 0, 0, _ENOSYS)]
    prog += _only(nr["socket"], [socket.AF_UNIX]) + _only(nr["socketpair"], [socket.AF_UNIX])
    # clone only with CLONE_THREAD in its flags.
    prog += [(_JEQ, 0, 4, nr["clone"]), (_LD, 0, 0, SECCOMP_DATA_ARG0),
             (_JSET, 1, 0, CLONE_THREAD), (_RET, 0, 0, _EPERM), (_RET, 0, 0, _ALLOW)]
    return b"".join(struct.pack(SOCK_FILTER, *ins) for ins in prog)


# Both built once, in the zygote; its workers inherit them.
_SECCOMP_HEAD = _seccomp_head(_ARCH) if _ARCH in _SYSCALLS else b""
_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.syscall.restype = ctypes.c_long


def _apply_seccomp(pid: int) -> bool:
    """The head, then signals (kill, tgkill, sigqueue) only to the worker itself: PR_SET_SECCOMP."""
    if _ARCH not in _SYSCALLS:
        return False
    nr = _SYSCALLS[_ARCH]
    # kill(2) of itself: its pid, 0 (its own process group) or -pid (that group, by its id).
    tail = _only(nr["kill"], [pid, 0, -pid]) + _only(nr["tgkill"], [pid])
    tail += _only(nr["rt_sigqueueinfo"], [pid]) + _only(nr["rt_tgsigqueueinfo"], [pid])
    tail += [(_RET, 0, 0, _ALLOW)]
    code = _SECCOMP_HEAD + b"".join(struct.pack(SOCK_FILTER, *ins) for ins in tail)
    buf = ctypes.create_string_buffer(code, len(code))
    # A struct sock_fprog: the number of instructions, then a pointer to them.
    prog = struct.pack("HxxxxxxP", len(code) // struct.calcsize(SOCK_FILTER), ctypes.addressof(buf))
    return _LIBC.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, prog, 0, 0) == 0


def _apply_landlock(scratch: str, read_dirs: list[str]) -> bool:
    """Reads (and executes) below read_dirs and of /dev/urandom, every right below scratch, nothing
    else; from ABI 4 no TCP bind or connect, from ABI 6 abstract unix sockets and signals scoped."""
    sysc = _LIBC.syscall
    abi = sysc(SYS_LANDLOCK_CREATE_RULESET, None, 0, LANDLOCK_CREATE_RULESET_VERSION)
    if abi < 1:
        return False
    fs = LANDLOCK_FS_RIGHTS[min(abi, max(LANDLOCK_FS_RIGHTS))]
    # struct landlock_ruleset_attr: the handled fs rights, then net rights (ABI 4), then scopes
    # (ABI 6); an older kernel takes the shorter struct.
    handled = [fs]
    if abi >= LANDLOCK_ABI_NET:
        handled.append(LANDLOCK_NET_RIGHTS)
    if abi >= LANDLOCK_ABI_SCOPED:
        handled.append(LANDLOCK_SCOPED)
    attr = struct.pack(f"{len(handled)}Q", *handled)
    rfd = sysc(SYS_LANDLOCK_CREATE_RULESET, attr, len(attr), 0)
    if rfd < 0:
        return False
    read = LANDLOCK_ACCESS_FS_EXECUTE | LANDLOCK_ACCESS_FS_READ_FILE | LANDLOCK_ACCESS_FS_READ_DIR
    rules = [(d, read) for d in read_dirs]
    rules += [("/dev/urandom", LANDLOCK_ACCESS_FS_READ_FILE), (scratch, fs)]
    for path, rights in rules:
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            continue
        # struct landlock_path_beneath_attr (packed): the rights granted, the directory's fd.
        rule = struct.pack("=Qi", rights & fs, fd)
        sysc(SYS_LANDLOCK_ADD_RULE, rfd, LANDLOCK_RULE_PATH_BENEATH, rule, 0)
        os.close(fd)
    ok = sysc(SYS_LANDLOCK_RESTRICT_SELF, rfd, 0) == 0
    os.close(rfd)
    return ok


# INFRA: the worker (a child of the zygote: it locks itself down, then serves one episode)
def _worker_setup(req_fd, rep_fd, uid, cfg, required):
    root = os.geteuid() == 0
    zygote = os.getppid()
    os.setsid()
    # Copies of the pipe ends above every fd dup2 is about to write, then the fixed fds.
    r, w = fcntl.fcntl(req_fd, fcntl.F_DUPFD, 10), fcntl.fcntl(rep_fd, fcntl.F_DUPFD, 10)
    null = os.open("/dev/null", os.O_RDWR)
    for fd, to in ((null, 0), (null, 1), (null, 2), (r, REQUEST_FD), (w, REPLY_FD)):
        os.dup2(fd, to)
    # Close every other fd.
    os.closerange(REPLY_FD + 1, max(1 << 16, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    tempfile.tempdir = scratch = os.path.join(cfg["scratch"], f"w{os.getpid()}")
    os.mkdir(scratch, 0o700)
    if cfg["own_scratch"] and cfg["mountns"]:
        # Its own scratch_mb tmpfs, in a mount namespace of its own that dies with it: no worker
        # can fill another's scratch.
        opts = f"size={cfg['scratch_mb']}m,mode=0700".encode()
        flags = MS_NOSUID | MS_NODEV
        if (_LIBC.unshare(CLONE_NEWNS) != 0
                or _LIBC.mount(b"tmpfs", scratch.encode(), b"tmpfs", flags, opts) != 0):
            raise OSError("cannot mount the worker's own scratch tmpfs")
    if root:
        os.chown(scratch, uid, uid)
    os.chdir(scratch)
    # The rest of the environment is the zygote's allow-list.
    os.environ.update(HOME=scratch, TMPDIR=scratch)
    limits = {resource.RLIMIT_AS: cfg["vsz"] + cfg["memory_mb"] * 2**20, resource.RLIMIT_CORE: 0,
              resource.RLIMIT_CPU: cfg["cpu_seconds"], resource.RLIMIT_FSIZE: cfg["fsize_mb"] << 20,
              resource.RLIMIT_NOFILE: WORKER_FDS,
              resource.RLIMIT_NPROC: WORKER_TASKS if root else 0}
    # CPU: SIGXCPU first, then SIGKILL.
    for lim, v in limits.items():
        resource.setrlimit(lim, (v, v + 1 if lim == resource.RLIMIT_CPU else v))
    layers = ["rlimits"] + [x for x in ("netns", "mountns") if cfg[x]]
    if root:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
        layers.append("uid")
    # In this order, seccomp last; the parent death signal counts only while the zygote lives.
    applied = {
        "pdeathsig": (_LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0
                      and os.getppid() == zygote),
        "nondumpable": _LIBC.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0,
        "no_new_privs": _LIBC.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0,
        "landlock": cfg["landlock"] and _apply_landlock(scratch, cfg["read_dirs"]),
        "seccomp": cfg["seccomp"] and _apply_seccomp(os.getpid())}
    layers += [layer for layer, ok in applied.items() if ok]
    if not set(required) <= set(layers):
        os._exit(EXIT_FAIL_CLOSED)
    random.seed()  # not the zygote's state
    # 32 bits: an int seed is MT19937's plain init; seed() would draw OS entropy through a
    # SeedSequence into the whole state, per worker.
    if "numpy.random" in sys.modules:
        sys.modules["numpy.random"].seed(random.getrandbits(32))
    return layers


# Worker-side conversion is friendliness only: the parent re-checks everything. The json encoder
# writes float and str subclasses by their real value whatever their overrides say.
def _w_obs(x) -> str:
    if not issubclass(type(x), str):  # type(): __class__ can lie
        raise FaultError("invalid_observation", f"observation of type {type(x).__name__}")
    return str.__str__(x)[:OBS_CAP]


def _w_encode(x) -> str:
    """JSON text of a result; exact bools, finite ints/floats and {} directly (a step's fields)."""
    if (t := type(x)) is bool or t is int or t is float and math.isfinite(x):
        return ("true" if x else "false") if t is bool else repr(x)
    if t is dict and not x:
        return "{}"
    try:
        return _dumps(x)
    except (ValueError, TypeError, RecursionError) as e:
        why = f"result is not JSON data: {type(e).__name__}: {e}"
        raise FaultError("invalid_result", why) from None


def _w_step(box, action) -> str:
    out = box["env"].step(action)
    # isinstance, not type(): a namedtuple is honest too.
    if not isinstance(out, (tuple, list)) or len(out) != 5:
        why = "step() must return obs, reward, terminated, truncated, info"
        raise FaultError("invalid_result", why)
    obs, reward, term, trunc, info = out
    if issubclass(type(reward), float) and not math.isfinite(reward):
        raise FaultError("invalid_reward", f"reward {float.__repr__(reward)} is not finite")
    head = f"[{_quote(_w_obs(obs))},{_w_encode(reward)},"
    return head + f"{_w_encode(term)},{_w_encode(trunc)},{_w_encode(info)}]"


def _w_reset(box, seed) -> str:
    out = box["env"].reset(seed=seed)
    # A bare str, a common slip, is (observation, {}).
    out = (out, {}) if issubclass(type(out), str) else out
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        raise FaultError("invalid_result", "reset() must return (observation, info)")
    return _w_encode([_w_obs(out[0]), out[1]])


def _w_namespace() -> dict:
    """The environment's module namespace, COMMON_NAMES bound as the game's own imports would."""
    ns = {"__name__": "__environment__"}
    # A fresh worker holds only the zygote's preloads, so numpy is here only if numpy=True.
    names = COMMON_NAMES | (NUMPY_NAMES if "numpy" in sys.modules else {})
    for name, path in names.items():
        module, _, attribute = path.partition(".")
        obj = __import__(module)  # preloaded: the module object `import` binds
        ns[name] = getattr(obj, attribute) if attribute else obj
    return ns


def _w_load(box, arg) -> str:
    source, setting, max_turns = arg
    ns = _w_namespace()
    if setting == "tool":
        # The zygote preloaded it: the worker cannot read this module's directory.
        from toolenv import ToolEnv
        ns["ToolEnv"] = ToolEnv
    # compile() inherits this module's `from __future__ import annotations`: the game's
    # annotations stay unevaluated (with the typing names bound, they would resolve anyway).
    exec(compile(source, "<environment>", "exec"), ns)
    cls = [v for v in ns.values() if isinstance(v, type) and v.__name__.endswith("Env")
           and v.__module__ == "__environment__"]
    if not cls:
        raise FaultError("load_error", "no class whose name ends in 'Env'")
    if setting == "tool" and not issubclass(cls[-1], ToolEnv):
        raise FaultError("load_error", f"{cls[-1].__name__} does not subclass ToolEnv")
    # As the authors' play: the class's own defaults, else (a TypeError) max_turns passed in;
    # then a larger turn budget of the game's own is cut to the agent's, as theirs is.
    try:
        box["env"] = env = cls[-1]()
    except TypeError:
        box["env"] = env = cls[-1](max_turns=max_turns)
    own = getattr(env, "max_turns", None)
    if type(own) is int and own > max_turns:
        env.max_turns = max_turns
    tools = env.tools() if setting == "tool" else []
    return _w_encode({"class_name": cls[-1].__name__, "tools": tools, "layers": box["layers"]})


def _w_contract(box, seed) -> str:
    # The zygote preloaded it, as for a tool environment's load.
    import toolenv
    try:
        return _w_encode(toolenv.self_check(box["env"], seed))
    except toolenv.ContractError as e:
        raise FaultError("unsolvable", str(e)) from None


def _w_program(box, arg) -> str:
    """Run a whole program as __main__: stdin from a scratch file on fd 0, fd 1 into another."""
    code, stdin, out_cap = arg
    with open("stdin.txt", "w", encoding="utf-8") as f:
        f.write(stdin)
    # These become sys.stdin and sys.stdout (UTF-8, and unused so far).
    os.dup2(os.open("stdin.txt", os.O_RDONLY), 0)
    os.dup2(os.open("stdout.txt", os.O_WRONLY | os.O_CREAT, 0o600), 1)
    sys.argv = ["solution.py"]
    status = "ok"
    try:
        exec(compile(code, "solution.py", "exec"), {"__name__": "__main__"})
        # Join the other non-daemon threads, as the interpreter does at exit.
        for t in threading.enumerate():
            if t is not threading.current_thread() and not t.daemon:
                t.join()
    except SystemExit as e:
        status = "ok" if e.code in (None, 0) else "error"
    except BaseException:  # noqa: BLE001 - the program's own failure
        status = "error"
    with contextlib.suppress(BaseException):  # its stdout may raise
        sys.stdout.flush()
    with open("stdout.txt", "rb") as f:
        return _dumps([status, f.read(out_cap).decode("utf-8", "replace")])


def _w_fault(e: BaseException, op: bytes) -> str:
    """[kind, message] of a request that raised (a raising __str__ ends the worker instead)."""
    if isinstance(e, FaultError):
        return _dumps([e.kind, e.message])
    kind = {b"L": "load_error", b"R": "reset_error"}.get(op, "step_error")
    kind = "memory_limit" if isinstance(e, MemoryError) else kind
    return _dumps([kind, f"{type(e).__name__}: {e}"[:300]])


def _w_serve(layers):
    """One request line in, one reply line out, until the trainer closes the pipe. The trainer sends
    only these ops; a line it did not send can only come from this worker itself."""
    box = {"layers": layers}
    ops = {b"S": _w_step, b"R": _w_reset, b"L": _w_load, b"T": _w_contract, b"P": _w_program}
    for line in open(REQUEST_FD, "rb", buffering=1 << 16):
        op, nonce, arg = line[:1], line[1:1 + NONCE_LEN], line[1 + NONCE_LEN:-1]
        try:
            out = nonce + REPLY_OK + ops[op](box, _loads(arg.decode())).encode() + b"\n"
        # Any BaseException: SystemExit, a custom BaseException, MemoryError.
        except BaseException as e:  # noqa: BLE001
            out = nonce + REPLY_FAULT + _w_fault(e, op).encode() + b"\n"
        while out:
            out = out[os.write(REPLY_FD, out):]
    os._exit(0)  # the trainer closed the pipe


# INFRA: the zygote (`python sandbox.py --zygote <fd> <json cfg>`; it never runs untrusted code)
def _zygote_setup(cfg: dict):
    """Once, before any worker: namespaces, preloads, a frozen GC; in cfg, what workers need."""
    import sysconfig
    root = os.geteuid() == 0
    cfg["netns"] = root and _LIBC.unshare(CLONE_NEWNET) == 0
    for mod in PRELOAD + (NUMPY_PRELOAD if cfg["numpy"] else ()):
        # Optional; imported before a tmpfs hides /tmp.
        with contextlib.suppress(Exception):
            __import__(mod)
    # -P left this dir off sys.path.
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    # ToolEnv for tool workers, who cannot read this dir; without it the trainer refuses "tool".
    with contextlib.suppress(Exception):
        import toolenv  # noqa: F401
    del sys.path[0]
    cfg["mountns"] = root and _LIBC.unshare(CLONE_NEWNS) == 0
    if cfg["mountns"]:
        # Nothing mounted here from now on reaches the host, nor the host's mounts here.
        _LIBC.mount(None, b"/", None, MS_REC | MS_PRIVATE, None)
        for path, size in ((b"/tmp", cfg["scratch_mb"]), (b"/var/tmp", 16), (b"/dev/shm", 16)):
            if os.path.isdir(path):
                opts = f"size={size}m,mode=1777".encode()
                flags = MS_NOSUID | MS_NODEV
                cfg["mountns"] &= _LIBC.mount(b"tmpfs", path, b"tmpfs", flags, opts) == 0
    gc.collect()
    gc.freeze()  # the children's GC skips it
    with open("/proc/self/statm") as f:  # the preloaded interpreter
        cfg["vsz"] = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE") + (16 << 20)
    cfg["scratch"] = tempfile.mkdtemp(prefix="spade-sbx-")
    os.chmod(cfg["scratch"], 0o711)
    paths = sysconfig.get_paths()
    cfg["read_dirs"] = sorted({paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
                              | {"/usr/lib", "/usr/lib64", "/lib", "/lib64", "/usr/share/zoneinfo"})


def _fork_worker(cfg: dict, free: list, live: dict, required: list) -> tuple[int, int, int]:
    """One locked-down worker with a free uid; it blocks on its request pipe until the first one."""
    (req_r, req_w), (rep_r, rep_w) = os.pipe(), os.pipe()
    uid = free.pop()
    try:
        pid = os.fork()
    except OSError:
        free.append(uid)
        list(map(os.close, (req_r, req_w, rep_r, rep_w)))
        raise
    if pid == 0:
        try:
            try:
                layers = _worker_setup(req_r, rep_w, uid, cfg, required)
                # Set up: from here on, the worker's death is the environment's fault.
                os.write(REPLY_FD, WORKER_READY)
            except BaseException as e:  # noqa: BLE001
                # Say why on the reply pipe, if it is there.
                os.write(REPLY_FD, f"{type(e).__name__}: {e}".encode())
                raise
            _w_serve(layers)
        finally:
            # Never fall back into the zygote's loop.
            os._exit(EXIT_NEVER_RETURN)
    list(map(os.close, (req_r, rep_w)))
    # The trainer's ends (O_NONBLOCK is shared with the fds it is sent).
    for fd in (req_w, rep_r):
        os.set_blocking(fd, False)
    live[pid] = uid
    return pid, req_w, rep_r


def _reap(pid: int, cfg: dict, free: list, live: dict) -> int:
    """SIGKILL (again: an exit under way keeps its cause); free scratch dir and uid; the status."""
    _killall(pid)
    status = os.waitpid(pid, 0)[1]
    shutil.rmtree(os.path.join(cfg["scratch"], f"w{pid}"), ignore_errors=True)
    free.append(live.pop(pid))
    return status


def _zygote_main(sock_fd: int, cfg: dict):
    """Serve the trainer's spawn / reap / wait requests; a worker per spawn, `pool` forked ahead."""
    # Die with the trainer; if it is already gone, exit now.
    _LIBC.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != cfg["parent"]:
        os._exit(0)
    sock = socket.socket(fileno=sock_fd)
    _zygote_setup(cfg)
    base = UID_BASE + (os.getpid() % UID_BLOCKS) * UIDS
    # The uids not in use, and pid -> uid of the live workers.
    free, live = list(range(base + UIDS - 1, base, -1)), {}
    pool, want = [], 0  # workers forked ahead; how many
    required = []  # layers every worker must have
    sock.send(json.dumps({"ready": 1, "toolenv": "toolenv" in sys.modules}).encode())
    while True:
        if len(pool) < want and len(free) > 1 and not select.select([sock], [], [], 0)[0]:
            # Refill while the trainer is busy.
            try:
                pool.append(_fork_worker(cfg, free, live, required))
            except OSError:
                want = 0
            continue
        if not (msg := sock.recv(1 << 16)):  # the trainer closed it
            for pid in list(live):
                _reap(pid, cfg, free, live)
            shutil.rmtree(cfg["scratch"], ignore_errors=True)
            os._exit(0)
        req = json.loads(msg)
        if req["op"] == "spawn":
            # `required` is set once, before any pool exists (the probe asks pool=0).
            required, want = req["required"], req["pool"]
            try:
                pid, req_w, rep_r = pool.pop(0) if pool else _fork_worker(cfg, free, live, required)
            except (OSError, IndexError) as e:  # no process, or no free uid
                sock.send(json.dumps({"error": f"spawn: {e}"}).encode())
                continue
            socket.send_fds(sock, [json.dumps({"pid": pid}).encode()], [req_w, rep_r])
            list(map(os.close, (req_w, rep_r)))
        elif req["op"] == "reap" and req["pid"] in live:  # no reply
            _reap(req["pid"], cfg, free, live)
        elif req["op"] == "wait":
            status = _reap(req["pid"], cfg, free, live) if req["pid"] in live else -1
            sock.send(json.dumps({"status": status}).encode())


# INFRA: the parent side. Everything read from a worker is re-validated here with type() checks.
def _killall(pid: int):
    """SIGKILL the worker and its process group (the group may not exist yet right after fork)."""
    for kill in (os.killpg, os.kill):
        with contextlib.suppress(OSError):
            kill(pid, signal.SIGKILL)


def _exit_reason(status: int) -> tuple[str, str]:
    """(kind, message) of a worker that exited, from the status the zygote reaped."""
    if status < 0:  # the zygote has no such pid
        return "worker_exited", "worker gone"
    if not os.WIFSIGNALED(status):
        return "worker_exited", f"worker exited with status {os.WEXITSTATUS(status)}"
    if (sig := os.WTERMSIG(status)) == signal.SIGXCPU:
        return "cpu_limit", "CPU time limit exceeded"
    return "worker_crashed", f"killed by {signal.Signals(sig).name}"


def _bad_text(x, depth=0) -> str | None:
    """Why parsed JSON data is not clean text (a NUL or a lone surrogate anywhere), else None."""
    if depth > 32:
        return "nested too deeply"
    if type(x) is str:
        if "\x00" in x:
            return "contains NUL"
        try:
            x.isascii() or x.encode("utf-8")  # ASCII has no surrogates
        except UnicodeEncodeError:
            return "lone surrogate"
        return None
    if type(x) is dict:
        x = [*x.keys(), *x.values()]
    if type(x) is not list:
        return None
    return next((m for v in x if (m := _bad_text(v, depth + 1))), None)


def clean_message(msg: str) -> str:
    """Short, printable message (no terminal control sequences) for observations and logs."""
    return "".join(c if c.isprintable() else "?" for c in str(msg)[:300])


# The result checks: pure functions of a reset's or step's fields, exact types only (a worker's
# JSON has no subclasses; a caller that converts first, as the worker does, passes plain values).
# The parent applies them to every reply; environments played outside the sandbox reuse them.
def _check_observation(obs) -> str:
    if type(obs) is not str:
        raise FaultError("invalid_observation", "observation: is not a str")
    if (why := _bad_text(obs)) is not None:
        raise FaultError("invalid_observation", f"observation: {why}")
    return obs[:OBS_CAP]


def _check_info(info) -> dict:
    if type(info) is not dict:
        raise FaultError("invalid_result", "info: is not a dict")
    # An empty info, the common case, has no text to check.
    if info and (why := _bad_text(info)) is not None:
        raise FaultError("invalid_result", f"info: {why}")
    return info


def check_reset(obs, info) -> tuple[str, dict]:
    """(observation cut at OBS_CAP, info) when both are clean text; else FaultError."""
    return _check_observation(obs), _check_info(info)


def check_step(obs, reward, terminated, truncated, info) -> tuple[str, float, bool, bool, dict]:
    """The step's result, reward as a float, when obs and info are clean text, the reward an int
    or float in [-10, 10] and both flags bools; else FaultError."""
    obs, info = _check_observation(obs), _check_info(info)
    # inf and NaN fail the compare.
    if type(reward) not in (float, int) or not -10 <= reward <= 10:
        raise FaultError("invalid_reward", f"reward {reward!r:.40} is not in [-10, 10]")
    if type(terminated) is not bool or type(truncated) is not bool:
        raise FaultError("invalid_result", "terminated/truncated are not bools")
    return obs, float(reward), terminated, truncated, info


@dataclass(slots=True)
class _Call:
    """The one request a handle has in flight: what its reply must answer, and when it is late."""
    op: str          # L load, R reset, S step, T tool contract, P program
    nonce: bytes     # NONCE_LEN hex digits from the parent's private RNG, the reply's first bytes
    fd: int          # the reply pipe, to poll
    t0: float        # time.monotonic() as the request went out
    deadline: float  # t0 + the call's timeout, or sooner: the episode's budget left
    bound: bool      # the episode's budget set the deadline (lateness is episode_timeout)
    episode: bool    # its time counts against the episode's budget (a load's, a program's do not)
    took: float = 0.0  # seconds until its reply line came


class EnvHandle:
    """One environment instance; every episode (reset) runs in a fresh worker. reset, step and
    the batch protocol never raise on misbehaviour: an environment fault becomes a Fault result
    (an error observation); load and call raise it (FaultError) for the validation probe.
    A handle's worker goes: started, its load in flight (_start) -> ready (load) -> one call in
    flight (_begin, a _Call) -> its reply read and checked (_end, _result) -> ready ..., until a
    fault, close() or the next episode ends it (_terminate) and the first reason is kept (_gone).
    line_cap: bytes per reply line."""

    def __init__(self, sb: "Sandbox", source: str | None, setting: str = "games",
                 line_cap: int = LINE_CAP):
        if setting == "tool" and not sb._has_toolenv:  # the caller's set-up
            raise SandboxInfraError(f"the tool setting needs toolenv.py, importable, beside "
                                    f"{os.path.abspath(__file__)}")
        self._sb, self.source, self.setting = sb, source, setting
        self.pid = self.class_name = self.layers = None  # set once loaded
        self._closed = False
        self._cap = line_cap
        self._start()

    # -- INFRA: lifecycle --------------------------------------------------------------------
    def _start(self):
        """A fresh worker from the zygote. The load request goes out now and its reply is read at
        first use (load), so handles opened one after another load in parallel."""
        self.pid, self._wfd, self._rfd = self._sb._spawn()
        # Reply bytes not yet a line; whether the set-up's WORKER_READY came.
        self._buf, self._acked = b"", False
        self._loading = False  # the load reply is still to be read
        self._dirty = False    # the worker has run more than the load: no new episode
        self._gone = None      # why the worker ended, once it has: (error class, its arguments)
        self._used = 0.0       # worker seconds of this episode
        self._call = None      # the call in flight, else the last one
        self._rpoll = select.poll()
        self._rpoll.register(self._rfd, select.POLLIN)
        self._sb._live.add(self)
        if self.source is not None:
            # A fault here is kept (self._gone) for the first use to report.
            with contextlib.suppress(FaultError):
                load = _dumps([self.source, self.setting, self._sb.max_turns])
                self._begin("L", load, self._sb.step_timeout, episode=False)
                self._loading = True

    def load(self):
        """Read the load reply, once; raises FaultError (the environment's), SandboxInfraError."""
        if self._loading:
            self._loading = False
            r = self._end(self._wait())
            if (type(r) is not dict or type(r.get("class_name")) is not str
                    or type(r.get("tools")) is not list):
                self._fail("protocol_violation", "malformed load reply")
            self.class_name, self._tools, self.layers = r["class_name"], r["tools"], r.get("layers")
        if self.pid is None:
            raise self._gone_error()

    def _prepare(self):
        """Before an episode: a fresh worker, unless this one has only loaded the source."""
        if self._closed:
            raise FaultError("closed", "handle closed")
        if self.pid is None or self._dirty:
            self._retire("closed")
            self._start()

    def close(self):
        """End the instance: its worker is killed and its scratch dir removed."""
        if not self._closed:
            self._closed = True
            self._retire("closed", "handle closed")

    # -- INFRA: the worker's end: terminate it, then keep why (the first reason stays) ---------
    def _terminate(self, wait: bool = False) -> int | None:
        """SIGKILL the worker's process group, have the zygote reap it, close the pipes. With `wait`
        the zygote answers with the exit status (-1: no such worker), else None. Raises
        SandboxInfraError when the zygote is gone (and its workers with it)."""
        _killall(self.pid)
        try:
            if wait:
                return self._sb._zygote({"op": "wait", "pid": self.pid})["status"]
            self._sb._zygote({"op": "reap", "pid": self.pid}, reply=False)
            return None
        finally:
            self._sb._live.discard(self)
            list(map(os.close, (self._rfd, self._wfd)))
            self.pid = None

    def _stop(self, message: str) -> str:
        """Terminate the worker if it runs; `message`, or why the zygote could not reap it."""
        if self.pid is not None:
            try:
                self._terminate()
            except SandboxInfraError as e:
                return f"sandbox fault: {e}"
        return message

    def _retire(self, kind: str, message: str = "") -> None:
        """End the worker for the environment fault `kind` (or a close), raising nothing."""
        message = self._stop(message)
        self._gone = self._gone or (FaultError, (kind, message))

    def _fail(self, kind: str, message: str = "") -> NoReturn:
        """End the worker for the environment fault `kind` and raise the error that ended it."""
        self._retire(kind, message)
        raise self._gone_error() from None

    def _infra(self, message: str) -> NoReturn:
        """End the worker for a failure of the sandbox itself: SandboxInfraError, raised."""
        message = self._stop(message)
        self._gone = self._gone or (SandboxInfraError, (clean_message(message),))
        raise self._gone_error() from None

    def _gone_error(self) -> Exception:
        """A fresh instance of the error that ended the worker (the first reason kept)."""
        error, args = self._gone
        return error(*args)

    def _died(self) -> NoReturn:
        """The worker closed its reply pipe: end it, and raise why from its exit status. One that
        died before its WORKER_READY is the sandbox's failure, not the environment's."""
        set_up = self._acked or self._buf.startswith(WORKER_READY)
        try:
            status = self._terminate(wait=True)
        except SandboxInfraError as e:  # the zygote is gone: no status to read
            self._fail("worker_exited", f"sandbox fault: {e}")
        if not set_up:
            self._infra(f"worker set-up failed: {self._buf[:200]!r}")
        self._fail(*_exit_reason(status))

    # -- INFRA: one request, one reply --------------------------------------------------------
    def _begin(self, op: str, arg: str, timeout: float, episode: bool = True) -> _Call:
        """Send request `op` with its JSON `arg`: the call now in flight. Raises FaultError."""
        # A new episode: a fresh worker and budget.
        if op in ("R", "T"):
            self._prepare()
            self._used = 0.0
        self.load()  # the load reply, if unread
        self._dirty |= op != "L"
        left = self._sb.episode_timeout - self._used if episode else math.inf
        if left <= 0:
            self._fail("episode_timeout", "episode time budget used up")
        # A fresh nonce from the trainer's private RNG: a line written before this request (still in
        # the pipe) cannot carry it, so _end rejects stale and unsolicited lines without a poll().
        nonce = b"%0*x" % (NONCE_LEN, self._sb._nonce_bits(4 * NONCE_LEN))
        data = b"%s%s%s\n" % (op.encode(), nonce, arg.encode())
        t0 = time.monotonic()
        # _Call(op, nonce, fd, t0, deadline, bound, episode): bound if the episode's budget binds.
        self._call = call = _Call(op, nonce, self._rfd, t0, t0 + min(left, timeout),
                                  left < timeout, episode)
        while data:  # one write, unless long
            try:
                data = data[os.write(self._wfd, data):]
            except BlockingIOError:
                # Wait for room: poll, as select() cannot take fds over 1023.
                room = select.poll()
                room.register(self._wfd, select.POLLOUT)
                if not room.poll(max(0, (call.deadline - time.monotonic()) * 1000)):
                    self._late()
            except BrokenPipeError:
                self._died()
        return call

    def _late(self) -> NoReturn:
        """The call in flight is past its deadline: end the worker, and raise its fault."""
        call = self._call
        if call.bound:
            self._fail("episode_timeout", "episode time budget used up")
        self._fail("timeout", f"no reply within {call.deadline - call.t0:g} s")

    def _read(self) -> bytes | None:
        """The reply line once complete; an exit, a line over the cap or bytes after it: ended."""
        try:
            chunk = os.read(self._rfd, 1 << 16)
        except BlockingIOError:
            return None
        if not chunk:
            self._died()
        self._buf += chunk
        i = self._buf.find(b"\n")
        if i > self._cap or (i < 0 and len(self._buf) > self._cap):
            self._fail("output_too_large", f"reply line over {self._cap} bytes")
        if i < 0:
            return None
        line, self._buf = self._buf[:i + 1], self._buf[i + 1:]
        if self._buf:
            self._fail("protocol_violation", "extra bytes after the reply line")
        return line

    def _wait(self) -> bytes:
        # Read before polling: a worker on this core has often replied by the time the write ends.
        while (line := self._read()) is None:
            ms = max(1, math.ceil((self._call.deadline - time.monotonic()) * 1000))
            if not self._rpoll.poll(ms) and time.monotonic() >= self._call.deadline:
                self._late()
        return line

    def _end(self, line: bytes):
        """The reply's result, once it answers the call in flight (its nonce) and is strict JSON;
        a fault the worker reports raises here, under its kind if FAULT_KINDS has it."""
        call = self._call
        # A fresh worker's WORKER_READY comes first.
        if not self._acked:
            if not line.startswith(WORKER_READY):
                self._infra(f"worker set-up failed: {line[:200]!r}")
            self._acked, line = True, line[len(WORKER_READY):]
        call.took = time.monotonic() - call.t0
        self._used += call.took if call.episode else 0.0
        # <nonce><REPLY_OK or REPLY_FAULT><JSON>, then the newline.
        nonce, marker = line[:NONCE_LEN], line[NONCE_LEN:NONCE_LEN + 1]
        text = line[NONCE_LEN + 1:-1]
        if nonce != call.nonce:
            self._fail("protocol_violation", "reply does not answer the request")
        try:
            r = _loads(text.decode())
        except (ValueError, RecursionError, StopIteration) as e:
            self._fail("protocol_violation", f"reply is not JSON: {e!r}")
        if marker == REPLY_OK:
            return r
        if marker != REPLY_FAULT or type(r) is not list or len(r) != 2 or type(r[0]) is not str:
            self._fail("protocol_violation", "reply is not a protocol line")
        kind = r[0] if r[0] in FAULT_KINDS else "protocol_violation"
        self._fail(kind, r[1] if type(r[1]) is str else "")

    def _leak_check(self):
        """A thread still running in the worker is a resource_leak; a worker that is gone is not."""
        with contextlib.suppress(OSError):
            if len(os.listdir(f"/proc/{self.pid}/task")) > 1:
                time.sleep(0.005)  # a just-joined one lingers
                if (n := len(os.listdir(f"/proc/{self.pid}/task"))) > 1:
                    self._fail("resource_leak", f"{n - 1} thread(s) left running")

    # -- the parent's re-validation: the reply's shape here, its fields in check_reset/check_step --
    def _result(self, r):
        """The reply of the call in flight as its result, checked; no thread may be left running
        at a reset, at the episode's end or after a tool contract transcript. A fault ends the
        worker (FaultError)."""
        op = self._call.op
        if op == "P":
            if (type(r) is not list or len(r) != 2 or r[0] not in ("ok", "error")
                    or type(r[1]) is not str):
                self._fail("protocol_violation", "malformed program reply")
            return r[0], r[1]
        if op == "T":
            if (m := "is not a list" if type(r) is not list else _bad_text(r)):
                self._fail("invalid_result", f"tool contract transcript: {m}")
            self._leak_check()
            return r
        step = op == "S"
        if type(r) is not list or len(r) != (5 if step else 2):
            self._fail("protocol_violation", "malformed reply")
        # Deviation 5: the authors' load rejects an empty first observation (a blank one passes).
        if not step and r[0] == "":
            self._fail("invalid_observation", "reset() returned an empty observation")
        try:
            out = check_step(*r) if step else check_reset(*r)
        except FaultError as e:
            self._fail(e.kind, e.message)
        if not step or out[2] or out[3]:
            self._leak_check()
        return out

    # -- one call at a time: the validation probe, run_program, step --------------------------
    def call(self, op: str, arg, timeout: float | None = None, *, strict: bool = False):
        """Send request `op` with `arg` (as JSON) and wait for its checked result: "R" reset(seed)
        -> (observation, info); "S" step(action) -> (observation, reward, terminated, truncated,
        info); "T" toolenv.self_check's transcript from seed `arg` -> a list; "P" a program, arg
        [code, stdin, out_cap] -> (status, stdout), outside the episode's budget. timeout:
        step_timeout if None. strict: no thread may be left running after a step either (the
        validation probe's rule). Raises FaultError (the worker has ended), SandboxInfraError."""
        if op not in ("R", "S", "T", "P"):
            raise ValueError(f"no call {op!r}: R, S, T or P")
        timeout = self._sb.step_timeout if timeout is None else timeout
        self._begin(op, _dumps(arg), timeout, episode=op != "P")
        out = self._result(self._end(self._wait()))
        if strict and op == "S":
            self._leak_check()
        return out

    @property
    def took(self) -> float:
        """Seconds until the last call's reply came (the validation probe's too_slow rule)."""
        return self._call.took

    # -- INFRA: the batch protocol Sandbox.reset_many / step_many drive -----------------------
    def prepare(self):
        """Before a batch of resets: this handle's fresh worker now, so the batch loads at once."""
        if not self._closed:
            self._prepare()

    def begin(self, op: str, arg: str) -> _Call | Fault:
        """Send a reset ("R", the JSON seed) or a step ("S", the JSON action) with step_timeout:
        the call in flight, or the Fault that ended it before it went out."""
        try:
            return self._begin(op, arg, self._sb.step_timeout)
        except FaultError as e:
            return Fault.of(e.kind, e.message, step=op == "S")

    def pump(self) -> tuple | Fault | None:
        """Read the reply pipe once: None until the reply line is whole, then the checked result of
        the call in flight, or its Fault."""
        try:
            line = self._read()
            return None if line is None else self._result(self._end(line))
        except FaultError as e:
            return Fault.of(e.kind, e.message, step=self._call.op == "S")

    def expire(self) -> Fault:
        """The call in flight is past its deadline: its worker ends, and its Fault."""
        try:
            self._late()
        except FaultError as e:
            return Fault.of(e.kind, e.message, step=self._call.op == "S")

    def reset(self, seed: int | None = None) -> tuple[str, dict]:
        # A worker start dwarfs the cost of the batch code.
        return self._sb.reset_many([self], [seed])[0]

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        try:
            return self.call("S", str(action))
        except FaultError as e:
            return Fault.of(e.kind, e.message, step=True)

    def tools(self) -> list[dict]:
        """OpenAI function schemas of a ToolEnv ([] for games)."""
        with contextlib.suppress(FaultError):
            self.load()
            return json.loads(_dumps(self._tools))  # a copy for the caller
        return []


class Sandbox(contextlib.AbstractContextManager):
    """Runs untrusted environments and programs; a context manager. workers: validations the caller
    runs at once; step_timeout: seconds per call (load, reset, step); memory_mb: address space per
    worker above the preloaded zygote; episode_timeout: worker seconds per episode; cpu_seconds /
    fsize_mb: RLIMIT_CPU / RLIMIT_FSIZE per worker; scratch_mb: one tmpfs for all scratch (root),
    or each worker's own with own_scratch; numpy: preload it (and bind np / numpy in
    environments); landlock / seccomp: False only to debug; pool: pre-forked idle workers;
    max_turns: what a class whose constructor requires it is built with (the agent's turn
    budget)."""

    def __init__(self, workers: int = 8, step_timeout: float = 5.0, memory_mb: int = 1024,
                 episode_timeout: float = 120.0, cpu_seconds: int = 300, fsize_mb: int = 16,
                 scratch_mb: int = 256, numpy: bool = True, landlock: bool = True,
                 seccomp: bool = True, pool: int = 8, max_turns: int = 25,
                 own_scratch: bool = False):
        self.workers, self.step_timeout = workers, step_timeout
        self.episode_timeout, self.max_turns = episode_timeout, max_turns
        self._cfg = dict(memory_mb=memory_mb, cpu_seconds=cpu_seconds, fsize_mb=fsize_mb,
                         scratch_mb=scratch_mb, numpy=numpy, landlock=landlock, seccomp=seccomp,
                         own_scratch=own_scratch)
        self._zlock = threading.RLock()     # one message to the zygote at a time
        self._live = set()                  # handles holding a worker
        self._required, self._pool = [], 0  # sent with each spawn; set after the probe
        self._proc = None                   # the zygote (_start_zygote: _has_toolenv)
        # Request nonces come from a private generator seeded by the OS: workers never see it.
        self._nonce_bits = random.Random(os.urandom(32)).getrandbits
        # Each handle holds two pipe fds (RLIM_INFINITY is -1).
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if 0 <= soft < 65536:
            want = 65536 if hard < 0 else min(hard, 65536)
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
        self._start_zygote()
        # A probe worker: which layers hold here.
        probe = EnvHandle(self, "class ProbeEnv:\n    pass\n")
        try:
            probe.load()
        except FaultError as e:
            raise SandboxInfraError(f"probe worker failed: {(e.kind, e.message)}") from None
        probe.close()
        self.layers = tuple(probe.layers)
        # Later workers fail closed: one missing a layer the probe had exits unused.
        self._required, self._pool = list(probe.layers), pool
        missing = [x for x in FULL if x not in self.layers]
        self.level = "full" if not missing else f"reduced (missing {', '.join(missing)})"
        self.level += "".join("+" + x for x in ("landlock", "mountns") if x in self.layers)

    # -- INFRA: zygote ------------------------------------------------------------------------
    def _start_zygote(self):
        self._zsock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = dict(PATH="/usr/bin:/bin", LANG="C.UTF-8", LC_ALL="C.UTF-8", PYTHONHASHSEED="0",
                   OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        # Not -I: its -E drops PYTHONHASHSEED.
        argv = [sys.executable, "-s", "-B", *(["-P"] if sys.version_info >= (3, 11) else []),
                os.path.abspath(__file__), "--zygote", str(theirs.fileno()),
                json.dumps(dict(self._cfg, parent=os.getpid()))]
        try:
            self._proc = subprocess.Popen(
                argv, env=env, close_fds=True, pass_fds=(theirs.fileno(),), cwd="/",
                start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL)
        except OSError as e:
            raise SandboxInfraError(f"cannot start the zygote: {e}") from None
        theirs.close()
        self._zsock.settimeout(60.0)
        try:
            ready = self._zsock.recv(1 << 16)
        except OSError as e:
            ready = str(e).encode()
        if not ready.startswith(b'{"ready": 1, '):
            raise SandboxInfraError(f"zygote did not start: {ready[:200]!r}")
        self._has_toolenv = json.loads(ready)["toolenv"]
        self._zsock.settimeout(10.0)

    def _zygote(self, msg: dict, reply=True):
        """One message to the zygote; its reply, and the pipe fds it passed (spawn)."""
        fds = []
        with self._zlock:
            try:
                if self._proc.poll() is not None:
                    raise OSError("zygote exited")
                self._zsock.send(json.dumps(msg).encode())
                if not reply:
                    return {}
                data, fds, _, _ = socket.recv_fds(self._zsock, 1 << 16, 2, socket.MSG_CMSG_CLOEXEC)
                out = json.loads(data or b"{}")
                if "error" in out:
                    raise OSError(out["error"])
                if msg["op"] == "spawn" and len(fds) != 2:  # out of fds here
                    raise OSError("no pipes came with the worker")
            except (OSError, ValueError) as e:
                list(map(os.close, fds))
                raise SandboxInfraError(f"zygote: {e}") from None
        return dict(out, fds=fds)

    def _spawn(self) -> tuple[int, int, int]:
        if self._proc is None:
            raise SandboxInfraError("sandbox is closed")
        with self._zlock:
            if self._proc.poll() is not None:  # zygote died: a new one
                self._zsock.close()
                self._start_zygote()
        out = self._zygote({"op": "spawn", "required": self._required, "pool": self._pool})
        return out["pid"], *out["fds"]  # pid, request w, reply r

    def close(self):
        for h in list(self._live):
            h.close()
        if self._proc is not None:
            try:
                self._zsock.close()  # zygote reaps and exits
                self._proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                self._proc.kill()
                self._proc.wait()
            self._proc = None

    def __exit__(self, *exc):
        self.close()

    def open(self, source: str, setting: str = "games") -> EnvHandle:
        """A handle to one instance; an environment fault shows up at reset/step, not here."""
        return EnvHandle(self, source, setting)

    def step_many(self, handles: list, actions: list) -> list[tuple]:
        """Step many handles at once (one outstanding request each); a fault ends only its own."""
        return self._many(handles, actions, step=True)

    def reset_many(self, handles: list, seeds: list) -> list[tuple]:
        return self._many(handles, seeds, step=False)

    def _many(self, handles, args, step):
        # The same handle twice in one batch: its calls one after another.
        if len(set(map(id, handles))) != len(handles):
            return [h.step(a) if step else h.reset(a) for h, a in zip(handles, args)]
        out = [None] * len(handles)
        # Fresh workers first, before any call waits on a load: they start and load in parallel.
        for h in handles if not step else ():
            h.prepare()
        pending = {}  # reply fd -> (index, handle, its call in flight)
        poller = select.poll()
        for i, (h, a) in enumerate(zip(handles, args)):
            call = h.begin("S", _quote(str(a))) if step else h.begin("R", _dumps(a))
            if isinstance(call, _Call):
                pending[call.fd] = (i, h, call)
                poller.register(call.fd, select.POLLIN)
            else:
                out[i] = call
        # Replies as they come: one that fills its pipe never waits behind a hung one.
        while pending:
            now = time.monotonic()
            for fd, (i, h, call) in list(pending.items()):
                if call.deadline <= now:
                    poller.unregister(fd)
                    del pending[fd]
                    out[i] = h.expire()
            wait = min([call.deadline for _, _, call in pending.values()], default=now) - now
            for fd, _ in poller.poll(max(1, math.ceil(wait * 1000))) if pending else ():
                i, h, _ = pending[fd]
                if (result := h.pump()) is not None:
                    out[i] = result
                    poller.unregister(fd)
                    del pending[fd]
        return out

    def run_program(self, code: str, stdin: str = "", timeout: float | None = None,
                    out_cap: int = 8 << 20) -> tuple[str, str]:
        """Run `code` as __main__ in a fresh worker under every layer: `stdin` on fd 0, at most
        `out_cap` bytes of stdout back as (status, stdout); status "ok" (exit 0), "error" (an
        exception, exit != 0) or the kind of the fault that ended the worker ("timeout", ...)."""
        h = EnvHandle(self, None, line_cap=8 * out_cap + 4096)  # JSON: <= 6 bytes per byte
        try:
            return h.call("P", [code, stdin, out_cap], timeout or self.step_timeout)
        except FaultError as e:
            return e.kind, ""
        finally:
            h.close()

    # -- ALGO: the validation probe (the paper's fixed actions plus an unpredictable probe) --------
    def validate(self, source: str, setting: str = "games") -> ValidationReport:
        """Probe in two fresh instances with one script; ok only if both pass and agree exactly."""
        rng = random.SystemRandom()  # not predictable constants
        words = ("a", "up", "left", "yes", "no", "7", "x", "reset", "0", "-1", "hint", "e4")
        extra = [r"\boxed{%s}" % rng.choice((str(rng.randrange(1000)), rng.choice(words)))
                 for _ in range(2)]
        script = ([("reset", 42)] + [("step", a) for a in PROBE_ACTIONS] + [("reset", 123)]
                  + [("reset", rng.randrange(1, 2**31 - 1))] + [("step", a) for a in extra])
        transcripts, name = [], None
        for _ in range(2):
            h = EnvHandle(self, source, setting)
            try:
                h.load()
                name = h.class_name or name
                transcripts.append(self._probe(h, script, setting))
                if transcripts[0] != transcripts[-1]:
                    pairs = enumerate(zip(*transcripts))
                    at = next((i for i, (a, b) in pairs if a != b), len(transcripts[0]))
                    why = f"fresh instances differ at probe call {at}"
                    raise FaultError("nondeterministic", why)
            except FaultError as e:
                return ValidationReport(False, f"{e.kind}: {e.message}", name, e.kind)
            finally:
                h.close()
        return ValidationReport(True, None, name)

    def _probe(self, h: EnvHandle, script, setting) -> list:
        out, over, times = [], False, {"reset": [], "step": []}
        for op, arg in script:
            if op == "reset":
                out.append(list(h.call("R", arg)))
            elif not over:  # stop at a terminal flag
                out.append(list(h.call("S", arg, strict=True)))
            else:
                continue
            over = op == "step" and (out[-1][2] or out[-1][3])
            times[op].append(h.took)
        # Slow calls hold the batch.
        for op, ts in times.items():
            if ts and (median := sorted(ts)[len(ts) // 2]) > SLOW_SHARE * self.step_timeout:
                limit = SLOW_SHARE * self.step_timeout
                raise FaultError("too_slow", f"median {op} call took {median:.3f} s, over "
                                             f"{SLOW_SHARE:g} x step_timeout = {limit:.3f} s")
        # toolenv.self_check, each seed in a fresh worker.
        for seed in (0, 1, 2) if setting == "tool" else ():
            out.append(h.call("T", seed))
        return out


if __name__ == "__main__" and len(sys.argv) == 4 and sys.argv[1] == "--zygote":
    _zygote_main(int(sys.argv[2]), json.loads(sys.argv[3]))
