#!/usr/bin/env bash
# Builds the Debian package, installs it on this machine (Debian 12) with apt, uses it the
# way an operator would, and purges it, checking that nothing is left behind. Root only;
# changes the machine's package state while it runs (fencefs installed, then purged).
#
#   scripts/package-test.sh          # 20-30 s when the release build exists (4 min if not)
#
# 1. scripts/package.sh, then `apt install ./target/debian/fencefs_*.deb`
# 2. fencefs --version (this checkout's commit), man -w fencefs / fencefs-policy, the
#    bash and fish completions complete, zsh's parses, dpkg -L = the .deb's file list
# 3. systemd-analyze verify fencefs@pkgtest.service (the installed template)
# 4. The installed unit, with all hardening directives, with none, and with each one
#    alone, each time checked through the mount and in /proc/MAINPID/status:
#    a. emulated here (scripts/unit-emulate.py; PID 1 of this machine is not systemd):
#       ExecStartPre, ExecStart under a $NOTIFY_SOCKET (Type=notify), ExecReload,
#       KillSignal, ExecStopPost, the directives applied as systemd applies them, and
#       logrotate with the installed /etc/logrotate.d/fencefs while the daemon runs. In a
#       private mount namespace (/etc an overlay, /run a tmpfs): the host's /etc/fencefs
#       and /run are untouched; /var/log/fencefs is the host's (purge must remove it).
#    b. controls: the emulation bites (a smaller bounding set fails, seccomp probes).
#    c. under a real systemd: the machine's OS tree booted in systemd-nspawn, systemctl
#       start/reload/stop, SIGKILL + Restart= (scripts/unit-nspawn-test.sh).
# 5. apt purge fencefs: every path the package brought (that did not exist before) is
#    gone, /var/log/fencefs too.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD

say() { printf '\n== %s\n' "$*"; }
fail() {
    echo "package-test: FAILED: $*" >&2
    exit 1
}
T0=$(date +%s.%N)
lap() { printf '   (%.1f s)\n' "$(echo "$(date +%s.%N) - $1" | bc)"; }

[[ $(id -u) -eq 0 ]] || fail "needs root (apt install, mounts)"
[[ $(. /etc/os-release && echo "$ID $VERSION_ID") == "debian 12" ]] ||
    echo "package-test: not Debian 12 ($(. /etc/os-release && echo "$PRETTY_NAME")); going on"

need=()
command -v man >/dev/null || need+=(man-db)
command -v systemd-analyze >/dev/null || need+=(systemd)
command -v logrotate >/dev/null || need+=(logrotate)
/usr/bin/python3 -c 'import seccomp' 2>/dev/null || need+=(python3-seccomp)
command -v setcap >/dev/null || need+=(libcap2-bin)
command -v zsh >/dev/null || need+=(zsh)
command -v fish >/dev/null || need+=(fish)
command -v bc >/dev/null || need+=(bc)
command -v unshare >/dev/null || need+=(util-linux)
command -v systemd-nspawn >/dev/null || need+=(systemd-container)
if ((${#need[@]})); then
    say "installing ${need[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

if dpkg-query -W -f '${Status}' fencefs 2>/dev/null | grep -q 'install ok installed'; then
    say "fencefs is installed already (an earlier run?): apt purge it first"
    apt-get purge -y -qq fencefs >/dev/null
fi

say "1. build and install"
t=$(date +%s.%N)
scripts/package.sh >/dev/null
deb=$(ls target/debian/fencefs_*.deb)
echo "   $deb ($(stat -c %s "$deb") bytes)"
WORK=$(mktemp -d /tmp/fencefs-pkgtest.XXXXXX)
chmod 755 "$WORK"
trap 'rm -rf "$WORK"' EXIT
# The package's paths, and which of them exist before it is installed.
dpkg-deb -c "$deb" | awk '{ print $6 }' | sed 's#^\.##; s#/$##' | grep -v '^$' | sort >"$WORK/paths"
while read -r p; do
    if [[ -e $p || -L $p ]]; then echo "$p"; fi
done <"$WORK/paths" >"$WORK/pre-existing"
apt install -y "./$deb" >"$WORK/apt-install.log" 2>&1 || {
    cat "$WORK/apt-install.log"
    fail "apt install"
}
dpkg-query -W -f '${Status} ${Version} ${Depends}\n' fencefs
[[ $(dpkg-query -W -f '${Depends}' fencefs) == *fuse3* ]] || fail "Depends lacks fuse3"
lap "$t"

say "2. the installed files"
[[ $(command -v fencefs) == /usr/bin/fencefs ]] || fail "fencefs not /usr/bin/fencefs"
want="fencefs $(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1) (commit $(git rev-parse HEAD))"
got=$(fencefs --version)
echo "   fencefs --version: $got"
[[ $got == "$want" ]] || fail "--version: want '$want'"
[[ $(man -w fencefs) == /usr/share/man/man1/fencefs.1.gz ]] || fail "man -w fencefs: $(man -w fencefs)"
[[ $(man -w fencefs-policy) == /usr/share/man/man5/fencefs-policy.5.gz ]] || fail "man -w fencefs-policy"
echo "   man -w: $(man -w fencefs) $(man -w fencefs-policy)"
schema=/usr/share/fencefs/fencefs-policy.schema.json
[[ -f $schema ]] || fail "the JSON Schema is not installed at $schema"
fencefs schema | cmp -s - "$schema" || fail "$schema differs from fencefs schema"
echo "   JSON Schema: $schema"
MANPAGER=cat MANWIDTH=80 man fencefs 2>/dev/null | grep -q 'MOUNT(8) AND FSTAB' || fail "man fencefs"
MANPAGER=cat MANWIDTH=80 man 5 fencefs-policy 2>/dev/null | grep -q 'RULE KEYS' || fail "man fencefs-policy"
comp=$(bash -c 'source /usr/share/bash-completion/completions/fencefs
    COMP_WORDS=(fencefs mo); COMP_CWORD=1; _fencefs fencefs mo fencefs; echo "${COMPREPLY[*]}"')
[[ $comp == mount ]] || fail "bash completion: '$comp'"
comp=$(fish -c 'complete -C "fencefs mount --no-w"' | cut -f1)
[[ $comp == --no-watch ]] || fail "fish completion: '$comp'"
zsh -n /usr/share/zsh/vendor-completions/_fencefs || fail "zsh completion syntax"
zsh -fc 'print -l $fpath' | grep -qx /usr/share/zsh/vendor-completions || fail "zsh fpath"
echo "   completions: bash 'fencefs mo' -> mount, fish 'fencefs mount --no-w' -> --no-watch, zsh parses"
dpkg -L fencefs | grep -v '^/\.$' | sort >"$WORK/listed"
diff -u "$WORK/paths" "$WORK/listed" || fail "dpkg -L differs from the .deb's contents"
echo "   dpkg -L fencefs: $(wc -l <"$WORK/listed") paths, the same as the .deb"

say "3. systemd-analyze verify fencefs@pkgtest.service"
out=$(systemd-analyze verify fencefs@pkgtest.service 2>&1) || fail "verify: $out"
[[ -z $out ]] || fail "verify printed: $out"
echo "   clean (no output, exit 0)"

say "4. the installed unit, run as systemd would (PID 1 here: $(ps -o comm= -p 1))"
t=$(date +%s.%N)
SRC=$WORK/src
mkdir -p "$SRC/secrets" "$SRC/docs"
echo hello >"$SRC/README.md"
echo TOKEN >"$SRC/secrets/key"
echo doc >"$SRC/docs/a.md"
cp /bin/true "$SRC/tool"
chown -R 1000:1000 "$SRC"
chmod 755 "$SRC"
cat >"$WORK/checks.sh" <<'EOF'
# Runs while the instance is up; $MAINPID is the daemon, $HARDENING what was applied, the
# daemon's log in $LOG (or printed by $LOGCMD: the journal under systemd), $SECCOMP_BASE
# the seccomp filters every process has there (nspawn's own).
set -euo pipefail
logtext() { if [[ -n ${LOGCMD:-} ]]; then eval "$LOGCMD"; else cat "$LOG"; fi; }
M=/run/fencefs/pkgtest
S=$SRC
bad() { echo "   check FAILED: $*" >&2; exit 1; }
# What a failed run (the control) may have left.
rm -f "$S/new.txt" "$S/rootfile" "$S/null"
setcap -r "$S/tool" 2>/dev/null || true
echo hello >"$S/README.md"
chown 1000:1000 "$S/README.md"
opts=$(awk -v m="$M" '$5 == m && / - fuse.fencefs / { print $6 "," $NF }' /proc/self/mountinfo)
[[ $opts == *nosuid* && $opts == *allow_other* ]] || bad "mountinfo: '$opts'"
[[ $(ls "$M" | tr '\n' ' ') == "README.md docs tool " ]] || bad "ls: $(ls "$M")"
as1000() { setpriv --reuid 1000 --regid 1000 --clear-groups sh -c "umask 022; $1"; }
[[ $(as1000 "cat $M/README.md") == hello ]] || bad "read as uid 1000"
as1000 "echo new > $M/new.txt"
[[ $(stat -c '%u:%g %a' "$S/new.txt") == "1000:1000 644" ]] || bad "new.txt: $(stat -c '%u:%g %a' "$S/new.txt")"
as1000 "echo x > $M/docs/a.md" 2>/dev/null && bad "docs writable"
as1000 "cat $M/secrets/key" 2>/dev/null && bad "secrets readable"
# CAP_MKNOD (allow_devices), CAP_SETFCAP (allow_setid), CAP_CHOWN, CAP_FOWNER.
mknod "$M/null" c 1 3 && [[ -c $S/null ]] || bad "mknod c 1 3"
rm "$M/null"
setcap cap_net_raw=ep "$M/tool" || bad "setcap"
[[ $(getcap "$S/tool") == *cap_net_raw=ep* ]] || bad "getcap: $(getcap "$S/tool")"
setcap -r "$M/tool"
echo r >"$M/rootfile" && chown 1000:1000 "$M/rootfile" && [[ $(stat -c %u "$S/rootfile") == 1000 ]] || bad "chown"
touch -d 2020-01-01 "$M/new.txt" && [[ $(stat -c %Y "$S/new.txt") == 1577836800 ]] || bad "utimens"
# fanotify (CAP_SYS_ADMIN): a host edit shows through the mount at once.
echo changed >"$S/README.md"
for _ in $(seq 50); do [[ $(cat "$M/README.md") == changed ]] && break; sleep 0.02; done
[[ $(cat "$M/README.md") == changed ]] || bad "host edit not visible within 1 s"
for want in "host changes: watched (fanotify)" "self-confinement: FUSE workers limited by Landlock" \
    "file I/O: kernel passthrough"; do
    logtext | grep -qF "$want" || bad "log lacks '$want'"
done
A=/var/log/fencefs/pkgtest.jsonl
for _ in $(seq 100); do grep -q '"path":"docs/a.md"' "$A" 2>/dev/null && break; sleep 0.02; done
grep -q '"path":"docs/a.md"' "$A" || bad "audit: no line for docs/a.md"
[[ $(stat -c %a /var/log/fencefs) == 750 ]] || bad "LogsDirectoryMode"
case $HARDENING in
all | UMask) [[ $(stat -c %a "$A") == 600 ]] || bad "audit file mode $(stat -c %a "$A") under UMask=0077" ;;
esac
if [[ $HARDENING == all ]]; then
    # logrotate with the installed snippet, while the daemon writes: the file is renamed,
    # the daemon gets SIGHUP and writes the next refusal into a new file.
    logrotate -f -s "$WORK/logrotate.state" /etc/logrotate.d/fencefs
    rotated=$(ls /var/log/fencefs/pkgtest.jsonl-* 2>/dev/null | head -1)
    [[ -n $rotated ]] || bad "logrotate: no rotated file"
    for _ in $(seq 100); do logtext | grep -q 'policy reloaded: generation 1' && break; sleep 0.02; done
    logtext | grep -q 'policy reloaded: generation 1' || bad "logrotate's postrotate sent no SIGHUP"
    # A refusal that reaches the daemon (no kernel cache answers it): create in docs/.
    as1000 "echo x > $M/docs/b.md" 2>/dev/null && bad "docs/b.md created"
    for _ in $(seq 100); do grep -q '"path":"docs/b.md"' "$A" 2>/dev/null && break; sleep 0.02; done
    grep -q '"path":"docs/b.md"' "$A" || bad "after logrotate: the new audit file gets no lines"
    grep -q '"path":"docs/b.md"' "$rotated" && bad "after logrotate: lines still go to $rotated"
    # Created by the serving daemon (umask 0): still 0600.
    [[ $(stat -c %a "$A") == 600 ]] || bad "reopened audit file mode $(stat -c %a "$A")"
    echo "   logrotate: $A -> $(basename "$rotated"), SIGHUP by postrotate, new lines in a new $A"
    rm -f /var/log/fencefs/pkgtest.jsonl-*
fi
# What was applied is in force in the daemon (/proc/$MAINPID): the signal thread was
# started before fencefs confines its workers, so its no_new_privs is the unit's.
st=/proc/$MAINPID/status
sigtask=$(grep -lx fencefs-signals /proc/$MAINPID/task/*/comm | head -1)
nnp=$(awk '/^NoNewPrivs:/ { print $2 }' "${sigtask%/comm}/status")
nfilters=$(awk '/^Seccomp_filters:/ { print $2 }' "$st")
sec=$((nfilters > ${SECCOMP_BASE:-0} ? 2 : 0))
got_bnd=$(capsh --decode="$(awk '/^CapBnd:/ { print $2 }' "$st")" | sed 's/.*=//' | tr ',' '\n' | sort | paste -sd,)
want_bnd=$(sed -n 's/^CapabilityBoundingSet=//p' "$UNIT" | tr 'A-Z ' 'a-z\n' | sort | paste -sd,)
case $HARDENING in
all) [[ $nnp == 1 && $got_bnd == "$want_bnd" && $sec == 2 ]] || bad "in force: nnp=$nnp seccomp=$sec caps=$got_bnd" ;;
none | UMask) [[ $nnp == 0 && $got_bnd != "$want_bnd" && $sec == 0 ]] || bad "in force: nnp=$nnp seccomp=$sec" ;;
NoNewPrivileges) [[ $nnp == 1 && $sec == 0 ]] || bad "in force: nnp=$nnp seccomp=$sec" ;;
CapabilityBoundingSet) [[ $got_bnd == "$want_bnd" && $nnp == 0 && $sec == 0 ]] || bad "in force: caps=$got_bnd" ;;
*) [[ $sec == 2 && $nnp == 0 ]] || bad "in force: seccomp=$sec nnp=$nnp" ;;
esac
echo "   in force in the daemon: NoNewPrivs=$nnp seccomp filters=$nfilters CapBnd=$([[ $got_bnd == "$want_bnd" ]] && echo "the unit's" || echo "all")"
rm -f "$S/new.txt" "$S/rootfile"
echo hello >"$S/README.md"
chown 1000:1000 "$S/README.md"
echo "   checks passed (uid 1000 r/w/refusals, mknod, setcap, chown, utimens, fanotify, Landlock, passthrough, audit)"
EOF
cat >"$WORK/ns.sh" <<'EOF'
set -euo pipefail
mkdir -p "$WORK/etc-upper" "$WORK/etc-work"
mount -t overlay overlay -o "lowerdir=/etc,upperdir=$WORK/etc-upper,workdir=$WORK/etc-work" /etc
mount -t tmpfs -o mode=0755 tmpfs /run
mkdir -p /etc/fencefs
cat >/etc/fencefs/pkgtest.toml <<'TOML'
mode = "workspace-write"
allow_devices = true
allow_setid = true

[[rule]]
path = "secrets"
access = "none"

[[rule]]
path = "docs"
access = "read"
TOML
sed -e "s#^SOURCE=.*#SOURCE=$SRC#" -e "s#^MOUNTPOINT=.*#MOUNTPOINT=/run/fencefs/pkgtest#" \
    /usr/share/doc/fencefs/examples/fencefs.env >/etc/fencefs/pkgtest.env
UNIT=/lib/systemd/system/fencefs@.service
directives=$(sed -n '/^# --- Hardening/,/^\[Install\]/ s/^\([A-Za-z]*\)=.*/\1/p' "$UNIT")
echo "   hardening directives in the unit: $(echo $directives)"
for h in all none $directives; do
    echo "-- hardening: $h"
    export HARDENING=$h LOG=$WORK/daemon-$h.log UNIT
    rm -f /var/log/fencefs/pkgtest.jsonl
    /usr/bin/python3 "$ROOT/scripts/unit-emulate.py" "$UNIT" pkgtest --hardening "$h" \
        --check "bash $WORK/checks.sh" --log "$LOG"
done
EOF
export WORK SRC ROOT
unshare -m --propagation private bash "$WORK/ns.sh" || fail "the unit (see above)"
lap "$t"

say "4b. controls: the emulated directives bite"
t=$(date +%s.%N)
# Without CAP_MKNOD and CAP_SETFCAP in the bounding set the checks must fail (at mknod):
# so passing them above means the bounding set was in force and is what fencefs needs.
sed 's/ CAP_MKNOD CAP_SETFCAP$//' /lib/systemd/system/fencefs@.service >"$WORK/fencefs@.service"
cat >"$WORK/ns-control.sh" <<'EOF'
set -uo pipefail
mount -t overlay overlay -o "lowerdir=/etc,upperdir=$WORK/etc-upper,workdir=$WORK/etc-work" /etc || exit 2
mount -t tmpfs -o mode=0755 tmpfs /run || exit 2
export HARDENING=CapabilityBoundingSet LOG=$WORK/daemon-control.log UNIT=$WORK/fencefs@.service
/usr/bin/python3 "$ROOT/scripts/unit-emulate.py" "$UNIT" pkgtest --hardening CapabilityBoundingSet \
    --check "bash $WORK/checks.sh" --log "$LOG" >"$WORK/control.out" 2>&1 && exit 1
grep -q 'check FAILED: mknod c 1 3' "$WORK/control.out" || exit 1
echo "   bounding set without CAP_MKNOD CAP_SETFCAP: the checks fail at 'mknod c 1 3', as they must"
EOF
unshare -m --propagation private bash "$WORK/ns-control.sh" || {
    cat "$WORK/control.out"
    fail "bounding-set control"
}
# Each seccomp rule refuses what it is for: a probe process under the same loader.
loader=$(/usr/bin/python3 -c "import runpy; print(runpy.run_path('$ROOT/scripts/unit-emulate.py')['SECCOMP_LOADER'])")
probe() { # DIRECTIVE PYTHON-STATEMENT WANT
    local got
    got=$(/usr/bin/python3 -c "$loader" "$1" /usr/bin/python3 -c "
import ctypes, errno, mmap, os, socket
libc = ctypes.CDLL(None, use_errno=True)
def chk(r):
    if r < 0:
        raise OSError(ctypes.get_errno(), '')
try:
    $2
    print('allowed')
except OSError as e:
    print(errno.errorcode[e.errno])
")
    [[ $got == "$3" ]] || fail "control $1: '$2' gave $got, want $3"
    printf '   %-24s %-13s for %s\n' "$1" "$3" "$2"
}
probe RestrictAddressFamilies 'socket.socket(socket.AF_INET)' EAFNOSUPPORT
probe RestrictNamespaces 'chk(libc.unshare(0x04000000))' EPERM
probe LockPersonality 'chk(libc.personality(0x0008))' EPERM
probe MemoryDenyWriteExecute 'mmap.mmap(-1, 4096, prot=mmap.PROT_WRITE | mmap.PROT_EXEC)' EPERM
probe RestrictRealtime 'os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))' EPERM
probe SystemCallArchitectures 'socket.socket(socket.AF_INET).close()' allowed
lap "$t"

say "4c. the installed unit under a real systemd (PID 1 of a systemd-nspawn container)"
t=$(date +%s.%N)
bash scripts/unit-nspawn-test.sh || fail "the unit under systemd (see above)"
lap "$t"

say "5. apt purge fencefs"
t=$(date +%s.%N)
[[ -d /var/log/fencefs ]] || fail "/var/log/fencefs was not created by the unit"
apt purge -y fencefs >"$WORK/apt-purge.log" 2>&1 || {
    cat "$WORK/apt-purge.log"
    fail "apt purge"
}
left=()
while read -r p; do
    if grep -qxF "$p" "$WORK/pre-existing"; then continue; fi
    if [[ -e $p || -L $p ]]; then left+=("$p"); fi
done <"$WORK/paths"
[[ -e /var/log/fencefs ]] && left+=(/var/log/fencefs)
((${#left[@]} == 0)) || fail "left behind after purge: ${left[*]}"
dpkg-query -W -f '${Status}' fencefs 2>/dev/null | grep -q installed && fail "still installed"
echo "   $(($(wc -l <"$WORK/paths") - $(wc -l <"$WORK/pre-existing"))) package paths (of $(wc -l <"$WORK/paths"); the others, /usr, /usr/share/man/man1, ..., existed before) and /var/log/fencefs: all gone"
lap "$t"

say "package test passed"
lap "$T0"
