#!/usr/bin/env bash
# The installed fencefs@.service under a real systemd: boots this machine's own OS tree
# (the fencefs package installed) in systemd-nspawn, systemd as PID 1 of the container,
# and there runs `systemctl start`, `reload` and `stop` of fencefs@pkgtest with all
# hardening directives, with none, and with each one alone (a drop-in resets the others),
# running the checks of scripts/package-test.sh against each instance.
#
#   called by scripts/package-test.sh with WORK (its temporary directory, holding
#   checks.sh) and SRC (the workspace) in the environment; root only
#
# The container's root is an overlay of / with a tmpfs on top (nothing it writes reaches
# the host), in a private mount namespace; it gets /dev/fuse, SRC bound at /srv/pkgtest,
# and the system calls nspawn's own filter would refuse but fencefs uses (fanotify and
# Landlock; without them fencefs runs, unwatched and unconfined, and says so). Host units
# enabled in /etc/systemd/system are masked in the container (whiteouts in the overlay).
set -euo pipefail
: "${WORK:?}" "${SRC:?}"
ROOTDIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

if ! command -v systemd-nspawn >/dev/null; then
    echo "   installing systemd-container (systemd-nspawn)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends systemd-container >/dev/null
fi

N=$WORK/nspawn
mkdir -p "$N"
cat >"$N/measure.sh" <<'EOF'
# In the container (systemd is PID 1).
set -u
U=fencefs@pkgtest
D=/run/systemd/system/$U.service.d
ALL=$(sed -n '/^# --- Hardening/,/^\[Install\]/ s/^\([A-Za-z]*\)=.*/\1/p' /lib/systemd/system/fencefs@.service)
reset() {
    case $1 in
    NoNewPrivileges) echo "NoNewPrivileges=no" ;;
    CapabilityBoundingSet) printf 'CapabilityBoundingSet=\nCapabilityBoundingSet=~\n' ;;
    RestrictAddressFamilies | SystemCallArchitectures) echo "$1=" ;;
    UMask) echo "UMask=0022" ;;
    *) echo "$1=no" ;;
    esac
}
# The filters every process systemd starts here has (nspawn's own, inherited by PID 1;
# this script, entered from the host, has none).
export SECCOMP_BASE=$(awk '/^Seccomp_filters:/ { print $2 }' /proc/1/status)
export UNIT=/lib/systemd/system/fencefs@.service SRC=/srv/pkgtest WORK=/tmp
echo "   systemd $(systemctl --version | head -1 | cut -d' ' -f2) is PID 1 here; nspawn's own seccomp filters: $SECCOMP_BASE"
fails=0
for h in all none $ALL; do
    echo "-- hardening: $h (systemctl, real systemd)"
    mkdir -p $D
    { echo "[Service]"; for d in $ALL; do
        case $h in all) ;; none) reset $d ;; *) [ "$d" = "$h" ] || reset $d ;; esac
      done; } >$D/measure.conf
    systemctl daemon-reload
    systemctl reset-failed $U 2>/dev/null
    rm -f /var/log/fencefs/pkgtest.jsonl
    since=$(date +%s.%N)
    export HARDENING=$h LOGCMD="journalctl -u $U --since @$since -o cat --no-pager"
    if ! systemctl start $U; then
        echo "   FAILED: systemctl start"; eval "$LOGCMD"; fails=$((fails + 1)); continue
    fi
    # Type=notify: "started" means the mount answers.
    [ -e /run/fencefs/pkgtest/README.md ] || { echo "   FAILED: not answering at start"; fails=$((fails + 1)); }
    MAINPID=$(systemctl show -p MainPID --value $U) bash /root/checks.sh || { eval "$LOGCMD"; fails=$((fails + 1)); }
    if [ "$h" = all ]; then
        # A crash: SIGKILL leaves a dead mount; ExecStopPost detaches it and Restart=
        # mounts again after RestartSec=.
        old=$(systemctl show -p MainPID --value $U)
        systemctl kill -s KILL --kill-who=main $U
        new=0
        for _ in $(seq 150); do
            new=$(systemctl show -p MainPID --value $U)
            [ "$new" != 0 ] && [ "$new" != "$old" ] && [ "$(systemctl is-active $U)" = active ] && break
            sleep 0.1
        done
        if [ "$new" != 0 ] && [ "$new" != "$old" ] && [ "$(cat /run/fencefs/pkgtest/README.md 2>&1)" = hello ]; then
            echo "   SIGKILL: ExecStopPost detached the dead mount, Restart= mounted again (pid $old -> $new)"
        else
            echo "   FAILED: no restart after SIGKILL ($old -> $new)"; eval "$LOGCMD"; fails=$((fails + 1))
        fi
    fi
    n=$(eval "$LOGCMD" | grep -c 'policy reloaded' || true)
    systemctl reload $U
    for _ in $(seq 100); do [ "$(eval "$LOGCMD" | grep -c 'policy reloaded')" -gt "$n" ] && break; sleep 0.02; done
    [ "$(eval "$LOGCMD" | grep -c 'policy reloaded')" -gt "$n" ] && echo "   systemctl reload: policy reloaded" || { echo "   FAILED: reload"; fails=$((fails + 1)); }
    systemctl stop $U
    r=$(systemctl show -p Result -p ExecMainStatus --value $U | paste -sd' ')
    [ "$r" = "success 0" ] && echo "   systemctl stop: Result=success, exit status 0" || { echo "   FAILED: stop: $r"; fails=$((fails + 1)); }
    grep -q ' /run/fencefs/pkgtest ' /proc/self/mountinfo && { echo "   FAILED: still mounted"; fails=$((fails + 1)); }
done
rm -rf $D
systemctl daemon-reload

# An fstab line under systemd: the fstab generator's mount unit runs mount(8), fencefs
# daemonizes inside the unit's cgroup and keeps logging to the journal.
echo "-- fstab line, systemd's mount unit"
echo "/srv/pkgtest /run/fencefs/fstab fuse.fencefs policy=/etc/fencefs/pkgtest.toml,allow_other,nofail,x-mount.mkdir 0 0" >>/etc/fstab
systemctl daemon-reload
M=run-fencefs-fstab.mount
since=$(date +%s.%N)
if systemctl start $M && [ "$(cat /run/fencefs/fstab/README.md)" = hello ] &&
    ! ls /run/fencefs/fstab/secrets 2>/dev/null; then
    pid=$(systemctl show -p ControlGroup --value $M | xargs -I{} cat /sys/fs/cgroup/unified{}/cgroup.procs 2>/dev/null | head -1)
    [ -z "$pid" ] && pid=$(pgrep -f "fencefs /srv/pkgtest /run/fencefs/fstab" | head -1)
    echo "   systemctl start $M: mounted by mount(8), daemon pid $pid ($(tr '\0' ' ' </proc/$pid/cmdline))"
    for _ in $(seq 50); do journalctl -u $M --since @$since -o cat | grep -q 'mounted /srv/pkgtest at /run/fencefs/fstab' && break; sleep 0.1; done
    if journalctl -u $M --since @$since -o cat | grep -q 'mounted /srv/pkgtest at /run/fencefs/fstab'; then
        echo "   the daemon's log is in the mount unit's journal (stderr kept: \$JOURNAL_STREAM)"
    else
        echo "   FAILED: no daemon log in the journal"; journalctl -u $M --since @$since -o cat; fails=$((fails + 1))
    fi
    systemctl stop $M
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.05; done
    if kill -0 "$pid" 2>/dev/null || grep -q ' /run/fencefs/fstab ' /proc/self/mountinfo; then
        echo "   FAILED: after systemctl stop $M: daemon or mount still there"; fails=$((fails + 1))
    else
        echo "   systemctl stop $M: unmounted, the daemon exited"
    fi
else
    echo "   FAILED: systemctl start $M"; journalctl -u $M --since @$since -o cat; fails=$((fails + 1))
fi
echo "$fails" >/root/measure.fails
EOF
cat >"$N/boot.sh" <<'EOF'
set -euo pipefail
mkdir -p "$N/t" "$N/root"
mount -t tmpfs -o mode=0755 tmpfs "$N/t"
mkdir -p "$N/t/upper" "$N/t/work"
mount -t overlay overlay -o "lowerdir=/,upperdir=$N/t/upper,workdir=$N/t/work" "$N/root"
R=$N/root
for w in multi-user default sockets timers sysinit getty; do
    rm -f "$R/etc/systemd/system/$w.target.wants/"*
done
mkdir -p "$R/etc/fencefs" "$R/srv/pkgtest"
cp "$WORK/etc-upper/fencefs/pkgtest.toml" "$R/etc/fencefs/"
sed -e "s#^SOURCE=.*#SOURCE=/srv/pkgtest#" "$WORK/etc-upper/fencefs/pkgtest.env" >"$R/etc/fencefs/pkgtest.env"
cp "$WORK/checks.sh" "$N/measure.sh" "$R/root/"
exec systemd-nspawn --quiet --register=no --keep-unit --machine=fencefs-pkgtest -D "$R" \
    --bind=/dev/fuse --bind="$SRC:/srv/pkgtest" \
    --system-call-filter='fanotify_init fanotify_mark landlock_create_ruleset landlock_add_rule landlock_restrict_self' \
    -b -- systemd.unit=multi-user.target
EOF
export N
timeout -k 5 300 unshare -m --propagation private bash "$N/boot.sh" >"$N/console.log" 2>&1 </dev/null &
BOOT=$!
init=
for _ in $(seq 300); do
    ns=$(pgrep -f -- "--machine=fencefs-pkgtest" | head -1 || true)
    if [[ -n $ns ]]; then init=$(pgrep -P "$ns" | head -1 || true); fi
    if [[ -n $init ]] && [[ $(cat /proc/"$init"/comm 2>/dev/null) == systemd ]]; then
        state=$(nsenter -t "$init" -a systemctl is-system-running --wait 2>/dev/null || true)
        [[ $state == running || $state == degraded ]] && break
    fi
    init=
    sleep 0.2
done
if [[ -z $init ]]; then
    cat "$N/console.log"
    echo "   FAILED: the container did not boot"
    exit 1
fi
nsenter -t "$init" -a bash /root/measure.sh
fails=$(nsenter -t "$init" -a cat /root/measure.fails)
nsenter -t "$init" -a systemctl poweroff || true
wait "$BOOT" || true
((fails == 0)) || {
    echo "   FAILED: $fails step(s) under systemd"
    exit 1
}
