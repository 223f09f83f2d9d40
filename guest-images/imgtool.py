#!/usr/bin/env python3
"""Helpers for guest-images/build.sh (standard library only).

Subcommands:
  libclosure ROOT PATH...     print, one per line, every path (relative to
                              ROOT, no leading slash) that the dynamic loader
                              needs to run PATH... (guest paths): the program interpreter,
                              the DT_NEEDED closure, and every symlink on the
                              way to the real files.
  modorder KDIR NAME...       print the .ko paths (relative to KDIR) of the
                              named modules and their `depends=` closure, in
                              load order (dependencies first).  Modules listed
                              in KDIR/modules.builtin are reported on stderr
                              and skipped.
  cpio STAGING OUT            write STAGING as an uncompressed newc cpio with
                              sorted names, mtime 0, uid/gid 0, plus the device
                              node /dev/console (c 5,1), no root needed.
  cpio-overlay STAGING OUT    the same without /dev and /dev/console: an
                              archive to append to the initramfs.
"""

import os
import stat
import struct
import sys


# ---------------------------------------------------------------- ELF reading

class Elf:
    """Minimal reader for 64-bit little-endian ELF files (what arm64 uses)."""

    def __init__(self, path):
        with open(path, "rb") as f:
            self.data = f.read()
        d = self.data
        if d[:4] != b"\x7fELF":
            raise ValueError(f"{path}: not an ELF file")
        if d[4] != 2 or d[5] != 1:
            raise ValueError(f"{path}: not ELF64 little-endian")
        (self.e_type, self.e_machine, _ver, _entry, self.phoff, self.shoff,
         _flags, _ehsize, self.phentsize, self.phnum, self.shentsize,
         self.shnum, self.shstrndx) = struct.unpack_from("<HHIQQQIHHHHHH", d, 16)

    def segments(self):
        for i in range(self.phnum):
            off = self.phoff + i * self.phentsize
            yield struct.unpack_from("<IIQQQQQQ", self.data, off)
            # p_type, p_flags, p_offset, p_vaddr, p_paddr, p_filesz, p_memsz, p_align

    def vaddr_to_offset(self, addr):
        for p_type, _fl, p_off, p_vaddr, _pa, p_filesz, _memsz, _al in self.segments():
            if p_type == 1 and p_vaddr <= addr < p_vaddr + p_filesz:
                return addr - p_vaddr + p_off
        raise ValueError(f"address {addr:#x} not in any PT_LOAD segment")

    def cstr(self, off):
        end = self.data.index(b"\0", off)
        return self.data[off:end].decode()

    def interpreter(self):
        for p_type, _fl, p_off, _va, _pa, p_filesz, _m, _al in self.segments():
            if p_type == 3:  # PT_INTERP
                return self.data[p_off:p_off + p_filesz].rstrip(b"\0").decode()
        return None

    def dynamic(self):
        """Return (needed list, runpath list) from PT_DYNAMIC."""
        dyn = None
        for p_type, _fl, p_off, _va, _pa, p_filesz, _m, _al in self.segments():
            if p_type == 2:  # PT_DYNAMIC
                dyn = (p_off, p_filesz)
        if dyn is None:
            return [], []
        entries = []
        strtab = None
        off, size = dyn
        for pos in range(off, off + size, 16):
            tag, val = struct.unpack_from("<qQ", self.data, pos)
            if tag == 0:
                break
            if tag == 5:  # DT_STRTAB
                strtab = self.vaddr_to_offset(val)
            entries.append((tag, val))
        needed, runpath = [], []
        for tag, val in entries:
            if tag == 1:  # DT_NEEDED
                needed.append(self.cstr(strtab + val))
            elif tag in (15, 29):  # DT_RPATH, DT_RUNPATH
                runpath.extend(p for p in self.cstr(strtab + val).split(":") if p)
        return needed, runpath

    def section(self, name):
        if self.shoff == 0:
            return None
        hdrs = []
        for i in range(self.shnum):
            hdrs.append(struct.unpack_from("<IIQQQQIIQQ", self.data,
                                           self.shoff + i * self.shentsize))
        names_off = hdrs[self.shstrndx][4]
        for h in hdrs:
            if self.cstr(names_off + h[0]) == name:
                return self.data[h[4]:h[4] + h[5]]
        return None


# ------------------------------------------------------- library dependencies

# Where the Debian arm64 loader looks when there is no ld.so.cache.
DEFAULT_LIB_DIRS = ["/lib/aarch64-linux-gnu", "/usr/lib/aarch64-linux-gnu",
                    "/lib", "/usr/lib"]


def in_root(root, path):
    return os.path.join(root, path.lstrip("/"))


def add_with_links(root, path, out):
    """Record PATH (absolute, inside ROOT) and every symlink hop to its
    target, including symlinked parent directories; return the real path."""
    seen = 0
    while True:
        seen += 1
        if seen > 40:
            raise RuntimeError(f"symlink loop at {path}")
        # Resolve parent directories first (they may be symlinks too).
        parent, base = os.path.split(path)
        if parent != "/":
            parent = add_with_links(root, parent, out)
        path = os.path.join(parent, base)
        out.add(path)
        host = in_root(root, path)
        if not os.path.islink(host):
            return path
        target = os.readlink(host)
        path = os.path.normpath(os.path.join(parent, target))


def libclosure(root, files):
    out = set()
    todo = ["/" + f.lstrip("/") for f in files]  # paths as seen in the guest
    done = set()
    missing = []
    while todo:
        path = todo.pop()
        real = add_with_links(root, path, out)
        if real in done:
            continue
        done.add(real)
        elf = Elf(in_root(root, real))
        interp = elf.interpreter()
        if interp:
            todo.append(interp)
        needed, runpath = elf.dynamic()
        origin = os.path.dirname(real)
        dirs = [p.replace("$ORIGIN", origin).replace("${ORIGIN}", origin)
                for p in runpath] + DEFAULT_LIB_DIRS
        for lib in needed:
            for d in dirs:
                cand = os.path.join(d, lib)
                if os.path.lexists(in_root(root, cand)):
                    todo.append(cand)
                    break
            else:
                missing.append(f"{lib} (needed by {real})")
    if missing:
        sys.stderr.write("imgtool: libraries not found in the extracted packages:\n  "
                         + "\n  ".join(sorted(set(missing))) + "\n")
        sys.exit(1)
    for p in sorted(out):
        print(p.lstrip("/"))


# ------------------------------------------------------------ kernel modules

def modinfo(path):
    sec = Elf(path).section(".modinfo")
    info = {}
    if sec:
        for item in sec.split(b"\0"):
            if b"=" in item:
                k, v = item.decode(errors="replace").split("=", 1)
                info.setdefault(k, v)
    return info


def modorder(kdir, names):
    index = {}
    for dirpath, _dirs, files in os.walk(kdir):
        for f in files:
            if f.endswith(".ko"):
                index[f[:-3].replace("-", "_")] = os.path.relpath(
                    os.path.join(dirpath, f), kdir)
    builtin = set()
    bpath = os.path.join(kdir, "modules.builtin")
    if os.path.exists(bpath):
        with open(bpath) as fh:
            for line in fh:
                builtin.add(os.path.basename(line.strip())[:-3].replace("-", "_"))
    order, state = [], {}

    def visit(name, chain):
        name = name.replace("-", "_")
        if state.get(name) == "done":
            return
        if state.get(name) == "active":
            raise RuntimeError("module dependency cycle: " + " -> ".join(chain + [name]))
        if name not in index:
            if name in builtin:
                sys.stderr.write(f"imgtool: {name} is built into the kernel\n")
                state[name] = "done"
                return
            raise RuntimeError(f"module {name} neither a .ko nor built-in")
        state[name] = "active"
        deps = modinfo(os.path.join(kdir, index[name])).get("depends", "")
        for dep in sorted(d for d in deps.split(",") if d):
            visit(dep, chain + [name])
        state[name] = "done"
        order.append(index[name])

    for n in names:
        visit(n, [])
    for p in order:
        print(p)


# ---------------------------------------------------------------- cpio newc

def cpio_header(name, ino, mode, nlink, size, rdevmajor=0, rdevminor=0):
    namebytes = name.encode() + b"\0"
    fields = [ino, mode, 0, 0, nlink, 0, size, 0, 0, rdevmajor, rdevminor,
              len(namebytes), 0]
    hdr = b"070701" + b"".join(b"%08X" % v for v in fields)
    hdr += namebytes
    hdr += b"\0" * (-len(hdr) % 4)
    return hdr


def write_cpio(staging, out, overlay=False):
    """With overlay, the archive is one the kernel unpacks after the
    initramfs (appended to it): it does not add /dev and /dev/console again."""
    entries = []
    for dirpath, dirs, files in os.walk(staging):
        for n in dirs + files:
            full = os.path.join(dirpath, n)
            entries.append(os.path.relpath(full, staging))
    extra = {} if overlay else {"dev/console": (stat.S_IFCHR | 0o600, 5, 1)}
    names = sorted(set(entries) | set(extra) | (set() if overlay else {"dev"}))
    ino = 0
    tmp = out + ".tmp"
    with open(tmp, "wb") as fh:
        for name in names:
            ino += 1
            full = os.path.join(staging, name)
            if name in extra and not os.path.lexists(full):
                mode, ma, mi = extra[name]
                fh.write(cpio_header(name, ino, mode, 1, 0, ma, mi))
                continue
            if name == "dev" and not os.path.lexists(full):
                fh.write(cpio_header(name, ino, stat.S_IFDIR | 0o755, 2, 0))
                continue
            st = os.lstat(full)
            perm = stat.S_IMODE(st.st_mode)
            if stat.S_ISLNK(st.st_mode):
                data = os.readlink(full).encode()
                mode = stat.S_IFLNK | 0o777
            elif stat.S_ISDIR(st.st_mode):
                data = b""
                mode = stat.S_IFDIR | perm
            elif stat.S_ISREG(st.st_mode):
                with open(full, "rb") as src:
                    data = src.read()
                mode = stat.S_IFREG | perm
            else:
                raise RuntimeError(f"unsupported file type: {full}")
            nlink = 2 if stat.S_ISDIR(mode) else 1
            fh.write(cpio_header(name, ino, mode, nlink, len(data)))
            fh.write(data)
            fh.write(b"\0" * (-len(data) % 4))
        fh.write(cpio_header("TRAILER!!!", 0, 0, 1, 0))
        pad = -fh.tell() % 512
        fh.write(b"\0" * pad)
    os.replace(tmp, out)


def main(argv):
    if len(argv) >= 3 and argv[1] == "libclosure":
        libclosure(os.path.abspath(argv[2]), argv[3:])
    elif len(argv) >= 3 and argv[1] == "modorder":
        modorder(argv[2], argv[3:])
    elif len(argv) == 4 and argv[1] == "cpio":
        write_cpio(argv[2], argv[3])
    elif len(argv) == 4 and argv[1] == "cpio-overlay":
        write_cpio(argv[2], argv[3], overlay=True)
    else:
        sys.stderr.write(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
