#!/usr/bin/python3
"""Runs a fencefs@.service instance the way systemd would, on a machine whose PID 1 is not
systemd (scripts/package-test.sh). Not systemd: an emulation, and it says what it applies.

    unit-emulate.py UNIT_FILE INSTANCE --hardening all|none|DIRECTIVE --check SCRIPT

From the unit file it reads EnvironmentFile= (%i substituted), Environment=, UMask=,
RuntimeDirectory=/LogsDirectory= (+Mode), ExecStartPre=, ExecStart=, ExecReload=,
ExecStopPost=, KillSignal= and the hardening directives, expands $VAR / ${VAR} as systemd
does ($VAR alone splits into words, ${VAR} is one word), and:

1. creates /run/<RuntimeDirectory> and /var/log/<LogsDirectory> with their modes,
2. runs ExecStartPre=, then ExecStart= with $NOTIFY_SOCKET bound here (Type=notify) and
   the hardening applied as below, and waits for READY=1 (TimeoutStartSec=30),
3. runs SCRIPT (bash) with MAINPID, the unit's environment and this one's: the checks,
4. runs ExecReload= ($MAINPID substituted) and waits for "policy reloaded" in the log,
5. sends KillSignal=, waits for the exit (status must be 0), runs ExecStopPost=.

Hardening, emulated (the directives systemd applies in the service's own process before
exec, nothing that needs a service manager):
  NoNewPrivileges=yes            setpriv --no-new-privs
  CapabilityBoundingSet=...      setpriv --bounding-set (root: permitted = bounding set)
  UMask=                         umask() before exec
  RestrictAddressFamilies=       seccomp: socket()/socketpair() of other families ->
                                 EAFNOSUPPORT
  RestrictNamespaces=yes         seccomp: unshare, setns, clone with CLONE_NEW* -> EPERM,
                                 clone3 -> ENOSYS (as systemd)
  LockPersonality=yes            seccomp: personality() other than the query -> EPERM
  MemoryDenyWriteExecute=yes     seccomp: mmap W+X, mprotect/pkey_mprotect X, shmat
                                 SHM_EXEC -> EPERM
  RestrictRealtime=yes           seccomp: sched_setscheduler/sched_setattr to a realtime
                                 policy -> EPERM
  SystemCallArchitectures=native seccomp filter for the native architecture only (other
                                 ABIs' system calls kill the process)
Prints one line per step; exit status 0 when every step passed.
"""

import argparse
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time

SECCOMP = ["RestrictAddressFamilies", "RestrictNamespaces", "LockPersonality",
           "MemoryDenyWriteExecute", "RestrictRealtime", "SystemCallArchitectures"]
HARDENING = ["NoNewPrivileges", "CapabilityBoundingSet", "UMask"] + SECCOMP


def parse_unit(path, instance):
    """Key → list of values of the [Service] (and other) sections, specifiers expanded."""
    out = {}
    for raw in open(path):
        line = raw.strip()
        if not line or line[0] in "#;[":
            continue
        key, _, value = line.partition("=")
        value = value.replace("%i", instance).replace("%I", instance).replace("%%", "%")
        out.setdefault(key.strip(), []).append(value.strip())
    return out


def read_env_file(path):
    env = {}
    for raw in open(path):
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        k, _, v = line.partition("=")
        env[k.strip()] = v.strip().strip('"')
    return env


def expand(cmdline, env):
    """systemd's Exec*= expansion: ${VAR} one word, $VAR split into words (empty: gone)."""
    prefix = ""
    while cmdline and cmdline[0] in "-@:+!":
        prefix += cmdline[0]
        cmdline = cmdline[1:]
    words = []
    for w in shlex.split(cmdline):
        m = re.fullmatch(r"\$([A-Za-z_][A-Za-z0-9_]*)", w)
        if m:
            words.extend(env.get(m.group(1), "").split())
            continue
        words.append(re.sub(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}",
                            lambda m: env.get(m.group(1), ""), w))
    return prefix, words


SECCOMP_LOADER = r'''
import errno, os, socket, sys, seccomp
from seccomp import Arg, EQ, NE, MASKED_EQ
want = set(sys.argv[1].split(",")) if sys.argv[1] else set()
f = seccomp.SyscallFilter(seccomp.ALLOW)   # native architecture only
# As systemd for a root service: the filter is loaded with CAP_SYS_ADMIN, without setting
# no_new_privs (libseccomp would set it by default).
f.set_attr(seccomp.Attr.CTL_NNP, 0)
if "RestrictAddressFamilies" in want:
    for sc in ("socket", "socketpair"):
        f.add_rule(seccomp.ERRNO(errno.EAFNOSUPPORT), sc, Arg(0, NE, socket.AF_UNIX))
if "RestrictNamespaces" in want:
    ns = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 \
        | 0x40000000 | 0x00000080   # NEWNS UTS IPC USER PID NET CGROUP TIME
    f.add_rule(seccomp.ERRNO(errno.EPERM), "unshare")
    f.add_rule(seccomp.ERRNO(errno.EPERM), "setns")
    for bit in range(32):
        if ns & (1 << bit):
            f.add_rule(seccomp.ERRNO(errno.EPERM), "clone", Arg(0, MASKED_EQ, 1 << bit, 1 << bit))
    f.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
if "LockPersonality" in want:
    f.add_rule(seccomp.ERRNO(errno.EPERM), "personality", Arg(0, NE, 0xffffffff))
if "MemoryDenyWriteExecute" in want:
    f.add_rule(seccomp.ERRNO(errno.EPERM), "mmap", Arg(2, MASKED_EQ, 6, 6))
    f.add_rule(seccomp.ERRNO(errno.EPERM), "mprotect", Arg(2, MASKED_EQ, 4, 4))
    f.add_rule(seccomp.ERRNO(errno.EPERM), "pkey_mprotect", Arg(2, MASKED_EQ, 4, 4))
    f.add_rule(seccomp.ERRNO(errno.EPERM), "shmat", Arg(2, MASKED_EQ, 0o100000, 0o100000))
if "RestrictRealtime" in want:
    for pol in (1, 2, 6):   # SCHED_FIFO, SCHED_RR, SCHED_DEADLINE
        f.add_rule(seccomp.ERRNO(errno.EPERM), "sched_setscheduler", Arg(1, EQ, pol))
    f.add_rule(seccomp.ERRNO(errno.EPERM), "sched_setattr")
f.load()
os.execv(sys.argv[2], sys.argv[2:])
'''


def hardened_argv(unit, argv, which):
    """argv with the chosen directives applied before exec, and what was applied."""
    applied = []
    pre = []
    chosen = HARDENING if which == "all" else [] if which == "none" else [which]
    for d in chosen:
        if d not in unit:
            sys.exit(f"unit-emulate: {d}= is not in the unit")
    if "NoNewPrivileges" in chosen and unit["NoNewPrivileges"][-1] == "yes":
        pre += ["--no-new-privs"]
        applied.append("NoNewPrivileges=yes")
    if "CapabilityBoundingSet" in chosen:
        caps = " ".join(unit["CapabilityBoundingSet"]).split()
        spec = "-all," + ",".join("+" + c.lower().removeprefix("cap_") for c in caps)
        pre += ["--bounding-set", spec]
        applied.append("CapabilityBoundingSet=" + " ".join(caps))
    sc = [d for d in chosen if d in SECCOMP]
    for d in sc:
        applied.append(f"{d}={unit[d][-1]}")
    if sc:
        argv = ["/usr/bin/python3", "-c", SECCOMP_LOADER, ",".join(sc)] + argv
    if pre:
        argv = ["setpriv"] + pre + ["--"] + argv
    umask = None
    if "UMask" in chosen:
        umask = int(unit["UMask"][-1], 8)
        applied.append(f"UMask={unit['UMask'][-1]}")
    return argv, umask, applied


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("unit")
    ap.add_argument("instance")
    ap.add_argument("--hardening", default="all")
    ap.add_argument("--check", required=True)
    ap.add_argument("--log", required=True)
    args = ap.parse_args()
    unit = parse_unit(args.unit, args.instance)
    fails = []

    env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
    for e in unit.get("Environment", []):
        for kv in shlex.split(e):
            k, _, v = kv.partition("=")
            env[k] = v
    for f in unit.get("EnvironmentFile", []):
        optional = f.startswith("-")
        f = f.lstrip("-")
        if os.path.exists(f) or not optional:
            env.update(read_env_file(f))
    for key, base in (("RuntimeDirectory", "/run"), ("LogsDirectory", "/var/log")):
        for d in unit.get(key, []):
            p = os.path.join(base, d)
            os.makedirs(p, exist_ok=True)
            os.chmod(p, int(unit.get(key + "Mode", ["0755"])[-1], 8))
            print(f"  {key}={d}: {p} mode {unit.get(key + 'Mode', ['0755'])[-1]}")

    for pre in unit.get("ExecStartPre", []):
        prefix, argv = expand(pre, env)
        r = subprocess.run(argv, env=env)
        if r.returncode != 0 and "-" not in prefix:
            sys.exit(f"ExecStartPre {argv}: exit {r.returncode}")
    _, argv = expand(unit["ExecStart"][-1], env)
    argv, umask, applied = hardened_argv(unit, argv, args.hardening)
    print(f"  hardening applied: {', '.join(applied) or 'none'}")

    sock_path = os.path.join(os.path.dirname(os.path.abspath(args.log)), "notify.sock")
    if os.path.exists(sock_path):
        os.unlink(sock_path)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(sock_path)
    log = open(args.log, "ab")
    denv = dict(env, NOTIFY_SOCKET=sock_path)
    t0 = time.time()
    p = subprocess.Popen(argv, env=denv, stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                         preexec_fn=(lambda: os.umask(umask)) if umask is not None else None)
    s.settimeout(0.2)
    ready = None
    while time.time() < t0 + 30 and ready is None:
        try:
            msg = s.recv(4096).decode()
        except socket.timeout:
            if p.poll() is not None:
                break
            continue
        fields = dict(l.split("=", 1) for l in msg.splitlines() if "=" in l)
        if fields.get("READY") == "1":
            ready = fields
    if ready is None:
        print(f"  FAILED: no READY=1 within 30 s (exit {p.poll()})")
        print(open(args.log).read())
        if p.poll() is None:
            p.kill()
            p.wait()
        sys.exit(1)
    print(f"  READY=1 after {time.time() - t0:.2f} s: {ready}")
    if ready.get("MAINPID") != str(p.pid):
        fails.append(f"MAINPID={ready.get('MAINPID')}, main process {p.pid}")

    r = subprocess.run(["bash", "-c", args.check],
                       env=dict(os.environ, **env, MAINPID=str(p.pid)))
    if r.returncode != 0:
        fails.append(f"checks failed (exit {r.returncode})")

    before = open(args.log, "rb").read().count(b"policy reloaded")
    for rl in unit.get("ExecReload", []):
        _, rargv = expand(rl.replace("$MAINPID", str(p.pid)), env)
        subprocess.run(rargv, check=True)
    deadline = time.time() + 10
    while open(args.log, "rb").read().count(b"policy reloaded") <= before:
        if time.time() > deadline:
            fails.append("ExecReload: no 'policy reloaded' in the log")
            break
        time.sleep(0.05)
    else:
        print("  ExecReload: policy reloaded")

    sig = getattr(signal, unit.get("KillSignal", ["SIGTERM"])[-1])
    p.send_signal(sig)
    try:
        rc = p.wait(30)
    except subprocess.TimeoutExpired:
        p.kill()
        rc = p.wait()
        fails.append("KillSignal: still running after 30 s")
    print(f"  KillSignal={sig.name}: exit {rc}")
    if rc != 0:
        fails.append(f"exit status {rc} after {sig.name}")
    for post in unit.get("ExecStopPost", []):
        prefix, pargv = expand(post, env)
        r = subprocess.run(pargv, env=env, stderr=subprocess.DEVNULL)
        if r.returncode != 0 and "-" not in prefix:
            fails.append(f"ExecStopPost {pargv}: exit {r.returncode}")
    s.close()
    os.unlink(sock_path)
    for f in fails:
        print(f"  FAILED: {f}")
    if fails:
        print(open(args.log).read())
    sys.exit(1 if fails else 0)


if __name__ == "__main__":
    main()
