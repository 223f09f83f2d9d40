#!/usr/bin/env bash
# Build the arm64 guest image (kernel Image + initramfs) from pinned Debian
# bookworm arm64 packages.  See guest-images/README.md.
#
#   guest-images/build.sh OUTDIR [cloud|generic]
#
# Writes OUTDIR/Image, OUTDIR/initramfs.cpio, OUTDIR/perf.cpio (an archive to
# append to the initramfs) and OUTDIR/manifest.txt with Debian's cloud
# (default) or generic arm64 kernel flavour.
# Needs: apt-get, dpkg-deb, python3, sha256sum, tar (all on Debian).
# Never touches the host's dpkg/apt state: apt runs with its own lists,
# cache and empty status file under guest-images/cache/.
#
# Environment (optional):
#   GUEST_IMAGES_CACHE  download cache (default: guest-images/cache)
#   DEBIAN_MIRROR       default http://deb.debian.org/debian
#   DEBIAN_SECURITY     default http://deb.debian.org/debian-security
#   GUEST_IMAGES_FORCE=1  rebuild even if OUTDIR is up to date
set -euo pipefail
umask 022
export LC_ALL=C

if [ $# -lt 1 ] || [ $# -gt 2 ]; then
    echo "usage: $0 OUTDIR [cloud|generic]" >&2
    exit 2
fi
FLAVOUR=${2:-cloud}
# The metapackage that names the flavour's current kernel package (its
# Depends: linux-image-<ABI>-<flavour suffix>).
case "$FLAVOUR" in
    cloud) KERNEL_META=linux-image-cloud-arm64 ;;
    generic) KERNEL_META=linux-image-arm64 ;;
    *) echo "$0: unknown kernel flavour '$FLAVOUR' (cloud or generic)" >&2; exit 2 ;;
esac

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
mkdir -p "$1"
OUT=$(cd "$1" && pwd)
CACHE=${GUEST_IMAGES_CACHE:-$HERE/cache}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECURITY=${DEBIAN_SECURITY:-http://deb.debian.org/debian-security}
KEYRING=/usr/share/keyrings/debian-archive-keyring.gpg
IMGTOOL=(python3 "$HERE/imgtool.py")

# Modules the guest needs (their depends= closure is added automatically),
# with the Kconfig symbol that says whether each is built in or a module.
# virtio_pci (for --disk virtio-pci) brings virtio_pci_legacy_dev and
# virtio_pci_modern_dev through its depends= (imgtool modorder); nvme (for
# --disk nvme; built into the cloud flavour, a module in the generic one)
# brings nvme_core.
GUEST_MODULES=(virtio_ring virtio virtio_mmio virtio_blk virtio_pci nvme)
declare -A MODULE_CONFIG=(
    [virtio_ring]=CONFIG_VIRTIO [virtio]=CONFIG_VIRTIO
    [virtio_mmio]=CONFIG_VIRTIO_MMIO [virtio_blk]=CONFIG_VIRTIO_BLK
    [virtio_pci]=CONFIG_VIRTIO_PCI [nvme]=CONFIG_BLK_DEV_NVME
)
# Programs whose shared-library closure goes into the initramfs.
GUEST_PROGRAMS=(/bin/busybox /usr/bin/fio /usr/bin/cyclictest)
# Programs that go into OUTDIR/perf.cpio instead, with the libraries of their
# closure that the initramfs lacks: perf's closure (libpython, libperl, glib...)
# is ~22 MB, which would push the initramfs past what fits between the kernel
# and QEMU's DTB and would crowd 256 MiB DomUs.  Append the archive to the
# initramfs for the guests that need it.
PERF_PROGRAMS=(/usr/bin/perf)

log() { echo "build.sh: $*" >&2; }
die() { echo "build.sh: ERROR: $*" >&2; exit 1; }

# ----------------------------------------------------------- up-to-date check
# The flavour is an input too: each flavour's OUTDIR has its own check.
INPUTS_HASH=$( (cd "$HERE" && sha256sum build.sh init imgtool.py packages.txt; echo "flavour: $FLAVOUR") |
              sha256sum | cut -d' ' -f1)

# Checks without a scratch file in OUTDIR: concurrent runs (parallel tests)
# check the same OUTDIR, and one would remove a shared file under another's
# check and make it rebuild.
outputs_up_to_date() {
    local m=$OUT/manifest.txt sums
    [ -f "$m" ] && [ -f "$OUT/Image" ] && [ -f "$OUT/initramfs.cpio" ] && [ -f "$OUT/perf.cpio" ] || return 1
    grep -qx "inputs-sha256: $INPUTS_HASH" "$m" || return 1
    sums=$(grep -E '^[0-9a-f]{64}  (Image|initramfs\.cpio|perf\.cpio)$' "$m") || return 1
    [ "$(printf '%s\n' "$sums" | wc -l)" -eq 3 ] || return 1
    (cd "$OUT" && printf '%s\n' "$sums" | sha256sum --quiet -c - >/dev/null 2>&1)
}

if [ "${GUEST_IMAGES_FORCE:-0}" != 1 ] && outputs_up_to_date; then
    log "$OUT is up to date (inputs $INPUTS_HASH); nothing to do"
    exit 0
fi

# ------------------------------------------------------------- apt, isolated
APTDIR=$CACHE/apt
DEBS=$CACHE/debs
mkdir -p "$APTDIR/lists/partial" "$APTDIR/cache/archives/partial" \
         "$APTDIR/sources.list.d" "$APTDIR/preferences.d" "$DEBS"
[ -f "$APTDIR/status" ] || : > "$APTDIR/status"
cat > "$APTDIR/sources.list.new" <<EOF
deb [signed-by=$KEYRING] $MIRROR bookworm main
deb [signed-by=$KEYRING] $MIRROR bookworm-updates main
deb [signed-by=$KEYRING] $SECURITY bookworm-security main
EOF
mv "$APTDIR/sources.list.new" "$APTDIR/sources.list"

APT_OPTS=(
    -oAPT::Architecture=arm64 -oAPT::Architectures=arm64
    -oDir::State::Lists="$APTDIR/lists" -oDir::Cache="$APTDIR/cache"
    -oDir::State::status="$APTDIR/status"
    -oDir::Etc::SourceList="$APTDIR/sources.list"
    -oDir::Etc::SourceParts="$APTDIR/sources.list.d"
    -oDir::Etc::Preferences="$APTDIR/preferences"
    -oDir::Etc::PreferencesParts="$APTDIR/preferences.d"
    -oAPT::Sandbox::User=root -oAcquire::Languages=none
    -oAcquire::IndexTargets::deb::DEP-11::DefaultEnabled=false
    -oAcquire::IndexTargets::deb::DEP-11-icons::DefaultEnabled=false
    -oAcquire::IndexTargets::deb::DEP-11-icons-small::DefaultEnabled=false
    -oAcquire::IndexTargets::deb::DEP-11-icons-hidpi::DefaultEnabled=false
    -oAcquire::IndexTargets::deb::CNF::DefaultEnabled=false
    -oAcquire::IndexTargets::deb::Contents-deb::DefaultEnabled=false
)
apt_get() { apt-get "${APT_OPTS[@]}" "$@" </dev/null; }
apt_cache() { apt-cache "${APT_OPTS[@]}" "$@" </dev/null; }

APT_UPDATED=0
apt_update_once() {
    [ "$APT_UPDATED" = 1 ] && return 0
    log "apt-get update (arm64 lists into $APTDIR)"
    apt_get -q update >&2 || die "apt-get update failed"
    APT_UPDATED=1
}

# Print the cached .deb for NAME VERSION, if present.
cached_deb() {
    local f
    for f in "$DEBS/${1}_${2//:/%3a}_"*.deb; do
        [ -f "$f" ] && { echo "$f"; return 0; }
    done
    return 1
}

# Download NAME=VERSION into the cache; return non-zero if it is not available.
download_deb() {
    local tmp rc=0
    apt_update_once
    tmp=$(mktemp -d "$CACHE/download.XXXXXX")
    (cd "$tmp" && apt_get -q download "$1=$2" >&2) || rc=$?
    if [ "$rc" = 0 ]; then
        mv "$tmp"/*.deb "$DEBS/"
    fi
    rm -rf "$tmp"
    return "$rc"
}

candidate_version() {
    apt_cache policy "$1" 2>/dev/null | awk '$1 == "Candidate:" && $2 != "(none)" { print $2 }'
}

# ------------------------------------------------------- fetch pinned debs
declare -a USED=() FALLBACKS=() DEBFILES=()
while read -r line; do
    line=${line%%#*}
    line=$(echo "$line" | tr -d '[:space:]')
    [ -n "$line" ] || continue
    # "FLAVOUR:name=version" lines belong to one kernel flavour only.
    if [[ $line == *:*=* && ${line%%:*} != *=* ]]; then
        only=${line%%:*}
        line=${line#*:}
        case "$only" in
            cloud | generic) [ "$only" = "$FLAVOUR" ] || continue ;;
            *) die "bad flavour '$only' in packages.txt" ;;
        esac
    fi
    name=${line%%=*}
    ver=${line#*=}
    [ "$name" != "$line" ] && [ -n "$ver" ] || die "bad line in packages.txt: $line"
    use_name=$name use_ver=$ver
    if ! deb=$(cached_deb "$name" "$ver"); then
        if ! download_deb "$name" "$ver"; then
            cand=$(candidate_version "$name")
            if [ -z "$cand" ] && [[ $name == linux-image-[0-9]*-arm64 ]]; then
                # The kernel's ABI number is part of the package name and old
                # ABIs leave the archive: follow the flavour's metapackage.
                use_name=$(apt_cache depends "$KERNEL_META" |
                           awk '$1 == "Depends:" && $2 ~ /^linux-image-/ { print $2; exit }')
                [ -n "$use_name" ] || die "cannot resolve $KERNEL_META"
                cand=$(candidate_version "$use_name")
            fi
            [ -n "$cand" ] || die "$name: pinned $ver is not downloadable and there is no candidate"
            echo "WARNING: $name=$ver is not downloadable; using $use_name=$cand instead" >&2
            FALLBACKS+=("$name=$ver -> $use_name=$cand")
            use_ver=$cand
            if ! cached_deb "$use_name" "$use_ver" >/dev/null; then
                download_deb "$use_name" "$use_ver" || die "cannot download $use_name=$use_ver"
            fi
        fi
        deb=$(cached_deb "$use_name" "$use_ver") || die "download of $use_name=$use_ver left no .deb"
    fi
    got="$(dpkg-deb -f "$deb" Package)=$(dpkg-deb -f "$deb" Version)"
    [ "$got" = "$use_name=$use_ver" ] || die "$deb contains $got, expected $use_name=$use_ver"
    USED+=("$got")
    DEBFILES+=("$deb")
done < "$HERE/packages.txt"
log "${#DEBFILES[@]} packages ready"

# --------------------------------------------------------------- extract
WORK=$(mktemp -d "$CACHE/work.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
ROOT=$WORK/root
STAGE=$WORK/stage
mkdir -p "$ROOT" "$STAGE"
for deb in "${DEBFILES[@]}"; do
    dpkg-deb -x "$deb" "$ROOT"
done

# ----------------------------------------------------------------- kernel
shopt -s nullglob
kernels=("$ROOT"/boot/vmlinuz-*)
shopt -u nullglob
[ "${#kernels[@]}" -eq 1 ] || die "expected exactly one /boot/vmlinuz-* (found ${#kernels[@]})"
KREL=${kernels[0]##*/vmlinuz-}
KCONFIG=$ROOT/boot/config-$KREL
[ -f "$KCONFIG" ] || die "missing /boot/config-$KREL"
# The arm64 Image header carries the magic "ARM\x64" at offset 0x38.
magic=$(od -An -tx1 -j 56 -N 4 "${kernels[0]}" | tr -d ' \n')
[ "$magic" = 41524d64 ] || die "vmlinuz-$KREL is not an uncompressed arm64 Image (magic $magic)"
case "$FLAVOUR:$KREL" in
    cloud:*-cloud-arm64 | generic:*[0-9]-arm64) ;;
    *) die "kernel $KREL is not the $FLAVOUR flavour (check packages.txt)" ;;
esac
log "kernel $KREL ($FLAVOUR flavour)"

# ---------------------------------------------------------------- modules
KDIR=$ROOT/lib/modules/$KREL
want=()
for m in "${GUEST_MODULES[@]}"; do
    sym=${MODULE_CONFIG[$m]}
    val=$(grep -E "^$sym=" "$KCONFIG" | cut -d= -f2 || true)
    case "$val" in
        y) log "$m: built in ($sym=y)" ;;
        m) log "$m: module ($sym=m)"; want+=("$m") ;;
        *) die "$m: $sym is not set in config-$KREL" ;;
    esac
done
# perf in the guest needs the arm64 PMUv3 driver (arch/arm64/kernel/perf_event.c,
# built when HW_PERF_EVENTS=y), which in 6.1 can only be built in.
for sym in CONFIG_PERF_EVENTS CONFIG_ARM_PMU CONFIG_HW_PERF_EVENTS; do
    grep -qx "$sym=y" "$KCONFIG" || die "$sym is not =y in config-$KREL (perf needs the PMUv3 driver)"
done
log "PMUv3 driver: built in (CONFIG_HW_PERF_EVENTS=y)"
mapfile -t MODS < <("${IMGTOOL[@]}" modorder "$KDIR" "${want[@]}")
mkdir -p "$STAGE/etc"
: > "$STAGE/etc/guest-modules"
for ko in "${MODS[@]}"; do
    install -D -m 0644 "$KDIR/$ko" "$STAGE/lib/modules/$KREL/$ko"
    echo "/lib/modules/$KREL/$ko" >> "$STAGE/etc/guest-modules"
done
log "modules (load order): ${MODS[*]##*/}"

# ------------------------------------------------- programs and libraries
for p in "${GUEST_PROGRAMS[@]}" "${PERF_PROGRAMS[@]}"; do
    [ -f "$ROOT$p" ] || die "$p is not in the packages"
done
"${IMGTOOL[@]}" libclosure "$ROOT" "${GUEST_PROGRAMS[@]}" > "$WORK/files.txt"
tar -C "$ROOT" --no-recursion -cf - -T "$WORK/files.txt" | tar -C "$STAGE" -xf -
# perf.cpio holds only what the initramfs does not already have.
PERF_STAGE=$WORK/perf-stage
mkdir -p "$PERF_STAGE"
"${IMGTOOL[@]}" libclosure "$ROOT" "${PERF_PROGRAMS[@]}" > "$WORK/perf-closure.txt"
grep -vxF -f "$WORK/files.txt" "$WORK/perf-closure.txt" > "$WORK/perf-files.txt" || true
tar -C "$ROOT" --no-recursion -cf - -T "$WORK/perf-files.txt" | tar -C "$PERF_STAGE" -xf -

# ---------------------------------------------------- initramfs skeleton
for d in bin sbin usr/bin usr/sbin lib etc proc sys dev tmp run root mnt var; do
    mkdir -p "$STAGE/$d"
done
chmod 1777 "$STAGE/tmp"
ln -sfn /proc/mounts "$STAGE/etc/mtab"
echo "root:x:0:0:root:/root:/bin/sh" > "$STAGE/etc/passwd"
echo "root:x:0:" > "$STAGE/etc/group"
install -m 0755 "$HERE/init" "$STAGE/init"

# ----------------------------------------------------------------- output
cp "${kernels[0]}" "$OUT/Image.tmp"
mv "$OUT/Image.tmp" "$OUT/Image"
"${IMGTOOL[@]}" cpio "$STAGE" "$OUT/initramfs.cpio"
"${IMGTOOL[@]}" cpio-overlay "$PERF_STAGE" "$OUT/perf.cpio"

{
    echo "# Guest image manifest, written by guest-images/build.sh"
    echo "inputs-sha256: $INPUTS_HASH"
    echo "kernel-flavour: $FLAVOUR"
    echo "kernel-release: $KREL"
    echo "# packages (name=version actually used)"
    for p in "${USED[@]}"; do echo "package: $p"; done
    for f in "${FALLBACKS[@]+"${FALLBACKS[@]}"}"; do echo "fallback: $f"; done
    echo "# modules in /etc/guest-modules (load order)"
    for ko in "${MODS[@]}"; do echo "module: $ko"; done
    echo "# sizes in bytes"
    echo "size: Image $(stat -c %s "$OUT/Image")"
    echo "size: initramfs.cpio $(stat -c %s "$OUT/initramfs.cpio")"
    echo "size: perf.cpio $(stat -c %s "$OUT/perf.cpio")"
    echo "# sha256 of the outputs (check with: sha256sum -c --ignore-missing manifest.txt)"
    (cd "$OUT" && sha256sum Image initramfs.cpio perf.cpio)
} > "$OUT/manifest.txt.tmp"
mv "$OUT/manifest.txt.tmp" "$OUT/manifest.txt"

if [ "${#FALLBACKS[@]}" -gt 0 ]; then
    for f in "${FALLBACKS[@]}"; do echo "WARNING: pin fell back: $f" >&2; done
fi
log "done: $OUT/Image ($(stat -c %s "$OUT/Image") bytes)," \
    "$OUT/initramfs.cpio ($(stat -c %s "$OUT/initramfs.cpio") bytes)," \
    "$OUT/perf.cpio ($(stat -c %s "$OUT/perf.cpio") bytes)"
