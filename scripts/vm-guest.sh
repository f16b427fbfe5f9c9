#!/bin/sh
# Prepares the VM guest tests/vhost.rs boots: a Debian kernel and an initramfs with
# busybox-static, the virtio/fuse/virtiofs modules and an /init that runs /test.sh (the
# test appends that as a second cpio segment). Cached: OUT/vmlinuz and OUT/initramfs.gz are
# made once. Installs what it needs (as root): qemu-system-x86 and busybox-static with apt,
# the kernel as Debian's linux-image-cloud-amd64 package fetched with `apt-get download` and
# unpacked with `dpkg-deb -x` (never installed into /boot).
#
# Usage: scripts/vm-guest.sh [OUT]   (default target/vm)
set -eu
OUT=${1:-target/vm}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
# One preparation at a time: two tests that start at once wait for the first (a second
# writer into OUT/work would corrupt the image both then boot).
exec 9>"$OUT/.lock"
flock 9

if [ -s "$OUT/vmlinuz" ] && [ -s "$OUT/initramfs.gz" ] && command -v qemu-system-x86_64 >/dev/null; then
    exit 0
fi

if ! command -v qemu-system-x86_64 >/dev/null || ! [ -x /bin/busybox ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >/dev/null
    apt-get install -y -q qemu-system-x86 busybox-static >/dev/null
fi

work=$OUT/work
rm -rf "$work"
mkdir -p "$work"
if ! ls "$OUT"/linux-image-*.deb >/dev/null 2>&1; then
    pkg=$(apt-cache depends linux-image-cloud-amd64 | sed -n 's/^ *Depends: \(linux-image-[^ ]*\)$/\1/p' | head -n1)
    [ -n "$pkg" ] || { apt-get update -q >/dev/null; pkg=$(apt-cache depends linux-image-cloud-amd64 | sed -n 's/^ *Depends: \(linux-image-[^ ]*\)$/\1/p' | head -n1); }
    [ -n "$pkg" ] || { echo "vm-guest.sh: no linux-image-cloud-amd64 package" >&2; exit 1; }
    (cd "$OUT" && apt-get download "$pkg" 2>/dev/null)
fi
dpkg-deb -x "$(ls "$OUT"/linux-image-*.deb | head -n1)" "$work/k"
kver=$(ls "$work/k/lib/modules" | head -n1)
mods=$work/k/lib/modules/$kver/kernel

root=$work/root
mkdir -p "$root/bin" "$root/dev" "$root/proc" "$root/sys" "$root/tmp" "$root/mnt" "$root/etc" "$root/lib/modules"
cp /bin/busybox "$root/bin/busybox"
for a in sh mount umount insmod ls cat echo mkdir rm touch stat sleep poweroff setpriv grep sed \
         sync mv id printf test tr wc ln chmod find seq dd sha256sum head tail cut xargs date tar du sort uniq; do
    ln -sf busybox "$root/bin/$a"
done
for m in drivers/virtio/virtio drivers/virtio/virtio_ring drivers/virtio/virtio_pci_modern_dev \
         drivers/virtio/virtio_pci_legacy_dev drivers/virtio/virtio_pci fs/fuse/fuse fs/fuse/virtiofs; do
    f=$mods/$m.ko
    [ -f "$f" ] || f=$(ls "$mods/$m".ko* | head -n1)
    cp "$f" "$root/lib/modules/"
done
# The static helper: `runas UID GID PROG ARGS` (busybox's setpriv cannot change ids).
cat >"$work/runas.c" <<'EOC'
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
int main(int argc, char **argv) {
    if (argc < 4) { fputs("usage: runas UID GID PROG ARGS\n", stderr); return 2; }
    gid_t g = (gid_t)atoi(argv[2]);
    if (setgroups(1, &g) || setgid(g) || setuid((uid_t)atoi(argv[1]))) { perror("runas"); return 1; }
    execvp(argv[3], argv + 3);
    perror(argv[3]);
    return 127;
}
EOC
cc -static -Os -o "$root/bin/runas" "$work/runas.c"
printf 'root:x:0:0:root:/:/bin/sh\nagent:x:1000:1000:agent:/tmp:/bin/sh\n' >"$root/etc/passwd"
printf 'root:x:0:\nagent:x:1000:\n' >"$root/etc/group"
cat >"$root/init" <<'EOF'
#!/bin/sh
# The guest's init: modules, the virtio-fs mount, then the test's /test.sh; powers off.
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
# In dependency order (no modules.dep here): pass after pass until all are in.
left="virtio_ring virtio virtio_pci_modern_dev virtio_pci_legacy_dev virtio_pci fuse virtiofs"
for pass in 1 2 3 4; do
    again=""
    for m in $left; do insmod /lib/modules/$m.ko 2>/dev/null || again="$again $m"; done
    left=$again
done
[ -z "$left" ] || echo "GUEST: modules not loaded:$left"
echo "GUEST: booted"
if [ -x /test.sh ]; then /test.sh; else echo "GUEST: no /test.sh"; fi
echo "GUEST: done"
sync
poweroff -f
EOF
chmod +x "$root/init"
(cd "$root" && find . | busybox cpio -o -H newc 2>/dev/null | gzip -1 >"$OUT/initramfs.gz.tmp")
# Padded to 512 bytes: the test appends its own cpio segment, which must start aligned.
sz=$(wc -c <"$OUT/initramfs.gz.tmp")
truncate -s $(( (sz + 511) / 512 * 512 )) "$OUT/initramfs.gz.tmp"
mv "$OUT/initramfs.gz.tmp" "$OUT/initramfs.gz"
cp "$work/k/boot/vmlinuz-$kver" "$OUT/vmlinuz"
rm -rf "$work"
echo "guest ready: $OUT/vmlinuz ($kver), $OUT/initramfs.gz"
