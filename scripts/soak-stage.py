#!/usr/bin/env python3
"""soak-stage.py --bin PATH --root DIR [--secs N] [--transport T] — the staging soak
(`scripts/soak.sh --stage` runs it): an agent writes, rewrites by rename, renames and
deletes files through a staged mount while the operator checkpoints, applies parts by
PATH@ID, applies --at N, rewinds and discards, and a host process saves files in SOURCE
by rename (as editors do). A ledger records every host save (content, when) and every
apply the daemon reported (what the operator read through the mount just before, when).

Pass, for every path at the end: SOURCE holds either the host's last save of it, when no
apply of it started after that save, or else the content of the last apply of it (or no
file, for an applied deletion); never a mix, nothing lost. And no apply carried a version
built on an older host save than the last one before it (each save is numbered, and the
agent's versions keep the numbers of the save they were built on): that save would have
been overwritten silently. Also: the daemon is alive,
stops cleanly, and after `discard` the mount shows SOURCE exactly.

Only what this script started is killed (by pid); the mount is under --root and is
unmounted here (scripts/test.sh also clears target/tmp/soak-* after a SIGKILL).
"""

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time

NAMES = [f"f{i:02d}.txt" for i in range(24)]


def now():
    return time.monotonic()


class Soak:
    def __init__(self, a):
        self.bin = a.bin
        self.root = a.root
        self.src = os.path.join(a.root, "src")
        self.mnt = os.path.join(a.root, "mnt")
        self.dir = os.path.join(a.root, "stage")
        self.sock = os.path.join(a.root, "ctl.sock")
        self.deadline = now() + a.secs
        self.transport = a.transport
        self.lock = threading.Lock()
        self.host = {}  # path -> [(t, content)]
        self.applied = {}  # path -> [(t0, t1, content or None)]
        self.stats = {"host": 0, "agent": 0, "applied": 0, "refused": 0, "checkpoints": 0,
                      "rewinds": 0, "discards": 0, "at": 0, "errors": 0}
        self.failures = []
        self.daemon = None

    def fencefs(self, *args, check=False):
        r = subprocess.run([self.bin, *args], capture_output=True, text=True, timeout=120)
        if check and r.returncode != 0:
            raise RuntimeError(f"fencefs {' '.join(args)}: {r.returncode}\n{r.stdout}{r.stderr}")
        return r

    def stage(self, *args):
        return self.fencefs("stage", args[0], self.sock, *args[1:])

    def start(self):
        os.makedirs(self.src)
        os.makedirs(self.mnt)
        for n in NAMES:
            self.save(n, f"host 0 {n}\n", t=0.0)
        pol = os.path.join(self.root, "policy.toml")
        with open(pol, "w") as f:
            f.write('mode = "workspace-write"\ndefault = "write"\n')
        args = [self.bin, "mount", "-p", pol, "--stage", self.dir, "--control", self.sock]
        if self.transport != "auto":
            args += ["--transport", self.transport]
        self.log = open(os.path.join(self.root, "daemon.log"), "w")
        self.daemon = subprocess.Popen(args + [self.src, self.mnt], stdout=self.log,
                                       stderr=subprocess.STDOUT)
        for _ in range(100):
            with open("/proc/self/mountinfo") as f:
                if f" {self.mnt} " in f.read() and os.path.exists(self.sock):
                    return
            time.sleep(0.1)
        raise RuntimeError("the staged mount did not come up")

    def save(self, n, content, t=None):
        """A host save: a temporary file renamed over the name."""
        tmp = os.path.join(self.src, f".{n}.swp")
        with open(tmp, "w") as f:
            f.write(content)
        os.rename(tmp, os.path.join(self.src, n))
        with self.lock:
            self.host.setdefault(n, []).append((now() if t is None else t, content))

    def host_loop(self):
        k = 0
        while now() < self.deadline:
            k += 1
            n = random.choice(NAMES)
            self.save(n, f"host {k} {n}\n" * random.randint(1, 3))
            self.stats["host"] += 1
            time.sleep(random.uniform(0.05, 0.3))

    def agent_loop(self):
        seq = 0
        while now() < self.deadline:
            seq += 1
            n = random.choice(NAMES)
            p = os.path.join(self.mnt, n)
            op = random.random()
            try:
                if op < 0.4:
                    with open(p, "a") as f:
                        f.write(f"agent {seq}\n")
                elif op < 0.65:
                    with open(p) as f:
                        data = f.read()
                    tmp = os.path.join(self.mnt, f".{n}.agent")
                    with open(tmp, "w") as f:
                        f.write(data.replace("host", "HOST") + f"rewrite {seq}\n")
                    os.rename(tmp, p)
                elif op < 0.75:
                    os.unlink(p)
                elif op < 0.85:
                    os.rename(p, os.path.join(self.mnt, random.choice(NAMES)))
                else:
                    with open(p, "x") as f:
                        f.write(f"agent new {seq}\n")
                self.stats["agent"] += 1
            except OSError:
                pass
            time.sleep(random.uniform(0.002, 0.02))

    def status(self):
        r = self.stage("status", "--json")
        if r.returncode != 0:
            self.stats["errors"] += 1
            return []
        return json.loads(r.stdout or "[]")

    def record(self, out, t0, shown):
        t1 = now()
        for line in out.splitlines():
            if line.startswith("applied "):
                parts = line.split(" ")
                letters, path = parts[1], parts[2]
                if path not in shown:
                    self.failures.append(f"applied a path never shown: {line}")
                    continue
                with self.lock:
                    self.applied.setdefault(path, []).append((t0, t1, shown[path]))
                self.stats["applied"] += 1
            elif line.startswith("refused "):
                self.stats["refused"] += 1

    def apply_some(self):
        changes = [c for c in self.status()
                   if c["change"] in ("modified", "added", "deleted") and "entries" not in c]
        if not changes:
            return
        pick = random.sample(changes, min(len(changes), random.randint(1, 4)))
        shown, args = {}, []
        for c in pick:
            p = c["path"]
            if c["change"] == "deleted":
                shown[p] = None
            else:
                try:
                    with open(os.path.join(self.mnt, p)) as f:
                        shown[p] = f.read()
                except OSError:
                    continue
            args.append(f"{p}@{c['id']}")
        if args:
            t0 = now()
            r = self.stage("apply", *args)
            self.record(r.stdout, t0, shown)

    def operator_loop(self):
        while now() < self.deadline:
            time.sleep(random.uniform(0.1, 0.4))
            op = random.random()
            if op < 0.25:
                if self.stage("checkpoint", "-m", "turn").returncode == 0:
                    self.stats["checkpoints"] += 1
            elif op < 0.7:
                self.apply_some()
            elif op < 0.8:
                r = self.stage("log", "--json")
                live = [c["n"] for c in json.loads(r.stdout or "[]") if not c.get("ended")]
                if live and self.stage("rewind", str(random.choice(live))).returncode == 0:
                    self.stats["rewinds"] += 1
            elif op < 0.9:
                changes = self.status()
                if changes:
                    c = random.choice(changes)
                    if self.stage("discard", f"{c['path']}@{c['id']}").returncode == 0:
                        self.stats["discards"] += 1
            else:
                # --at N: the contents are those sealed at N, which the operator reads
                # from the checkpoint's view only through `diff`; recorded as "any
                # content the agent could have written", so such paths are checked for
                # presence and no mix with a host save, not for exact bytes.
                r = self.stage("log", "--json")
                live = [c["n"] for c in json.loads(r.stdout or "[]") if not c.get("ended")]
                if live:
                    t0 = now()
                    r = self.stage("apply", "--at", str(live[-1]))
                    t1 = now()
                    self.stats["at"] += 1
                    for line in r.stdout.splitlines():
                        if line.startswith("applied "):
                            parts = line.split(" ")
                            with self.lock:
                                self.applied.setdefault(parts[2], []).append(
                                    (t0, t1, "<at>" if parts[1] != "D" else None))

    def built_on_stale(self, p, t0, content):
        """An applied version built on a host save older than the last one before the
        apply started: that save was silently overwritten."""
        saves = [c for (t, c) in self.host.get(p, []) if t < t0]
        if not saves or content in (None, "<at>"):
            return None
        last = int(saves[-1].split(" ")[1])
        seen = [int(m.group(1)) for m in re.finditer(r"(?:host|HOST) (\d+) " + re.escape(p), content)]
        if seen and max(seen) < last:
            return f"{p}: an apply carried a version built on host save {max(seen)} over save {last}"
        return None

    def history(self, p):
        """The ledger of `p`, for a failure's report."""
        ev = [(t, "host save", c) for (t, c) in self.host.get(p, [])]
        ev += [(t0, f"apply (done +{t1 - t0:.3f}s)", c) for (t0, t1, c) in self.applied.get(p, [])]
        return "\n".join(f"    {t:10.3f} {what}: {c!r}" for (t, what, c) in sorted(ev, key=lambda e: e[0]))

    def check(self):
        for p, evs in self.applied.items():
            for (t0, _t1, content) in evs:
                bad = self.built_on_stale(p, t0, content)
                if bad:
                    self.failures.append(bad + "\n" + self.history(p))
        paths = set(NAMES) | set(self.applied)
        for p in sorted(paths):
            try:
                with open(os.path.join(self.src, p)) as f:
                    final = f.read()
            except FileNotFoundError:
                final = None
            saves = self.host.get(p, [])
            th, ch = saves[-1] if saves else (0.0, None)
            applies = self.applied.get(p, [])
            after = [a for a in applies if a[0] > th]
            overlap = [a for a in applies if a[0] <= th <= a[1]]
            if after:
                want = {after[-1][2]}
            else:
                want = {ch} | {a[2] for a in overlap}
            # An apply --at N carried N's bytes, which the operator did not read: any
            # file stands for it (a host save replaced by it is caught by the ids).
            ok = final in want or ("<at>" in want and final is not None)
            if not ok:
                self.failures.append(
                    f"{p}: SOURCE holds {final!r}, expected one of {sorted(map(repr, want))}")

    def stop(self):
        if self.daemon and self.daemon.poll() is None:
            self.daemon.send_signal(signal.SIGTERM)
            try:
                self.daemon.wait(30)
            except subprocess.TimeoutExpired:
                self.daemon.kill()
                self.daemon.wait()
                self.failures.append("the daemon did not stop on SIGTERM")
        with open("/proc/self/mountinfo") as f:
            if f" {self.mnt} " in f.read():
                subprocess.run(["fusermount3", "-u", "-z", self.mnt])
                self.failures.append("the mount was left behind")

    def run(self):
        self.start()
        threads = [threading.Thread(target=t) for t in
                   (self.host_loop, self.agent_loop, self.operator_loop)]
        try:
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            if self.daemon.poll() is not None:
                self.failures.append(f"the daemon died: {self.daemon.returncode}")
            else:
                # Everything left staged goes; the merged view must then be SOURCE.
                self.stage("discard")
                for n in NAMES:
                    a = os.path.join(self.src, n)
                    b = os.path.join(self.mnt, n)
                    ra = open(a).read() if os.path.exists(a) else None
                    rb = open(b).read() if os.path.exists(b) else None
                    if ra != rb:
                        self.failures.append(f"{n}: after discard the mount shows {rb!r}, "
                                             f"SOURCE {ra!r}")
        finally:
            self.stop()
        self.check()
        print("soak-stage:", json.dumps(self.stats))
        for f in self.failures:
            print("FAIL:", f)
        return 1 if self.failures else 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--root", required=True)
    ap.add_argument("--secs", type=float, default=600)
    ap.add_argument("--transport", default="auto")
    a = ap.parse_args()
    random.seed(os.getpid())
    sys.exit(Soak(a).run())


if __name__ == "__main__":
    main()
