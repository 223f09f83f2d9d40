//! A flat, checked view of the tree: every node with its full path and the
//! context inherited from its ancestors, plus small property decoders.
//!
//! The `fdt` crate gives nodes, names and raw properties; everything that
//! interprets a value is done here on raw bytes with explicit length checks,
//! because the crate's own helpers either panic (`cell_sizes` on a short
//! value, `find_node` recursing through aliases) or silently truncate.
//!
//! Cell sizes are inherited the way Linux's `of_n_addr_cells` and Xen's boot
//! parser do it: a node without `#address-cells`/`#size-cells` uses its
//! parent's, the root defaults to 2/1. This matters for QEMU's
//! `/chosen/module@…` nodes, whose 2+2-cell `reg` relies on inheriting the
//! root's 2/2 because `/chosen` declares nothing.

use alloc::string::String;
use alloc::vec::Vec;

use fdt::node::FdtNode;
use fdt::Fdt;

use super::blob::MAX_DEPTH;
use super::{DtbError, Region};
use crate::intid::IntId;

/// Address/size cell counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cells {
    pub addr: u32,
    pub size: u32,
}

/// Root defaults from the devicetree specification.
pub const ROOT_CELLS: Cells = Cells { addr: 2, size: 1 };

/// One node of the tree with what it inherits.
#[derive(Clone, Copy)]
pub struct Entry<'b, 'a> {
    pub node: FdtNode<'b, 'a>,
    /// Index of the full path in [`Index::paths`].
    pub path: usize,
    pub depth: usize,
    /// Index of the parent node (`None` for the root).
    pub parent: Option<usize>,
    /// Cells that this node's own `reg` is encoded with (the parent's).
    pub reg_cells: Cells,
    /// Cells this node's children use (its own, or inherited).
    pub child_cells: Cells,
    /// The node's `phandle` (or legacy `linux,phandle`).
    pub phandle: Option<u32>,
}

/// All nodes in depth-first (document) order.
pub struct Index<'b, 'a> {
    pub entries: Vec<Entry<'b, 'a>>,
    pub paths: Vec<String>,
}

/// The root node. Only call on a blob that passed `blob::check`.
pub fn root<'b, 'a>(fdt: &'b Fdt<'a>) -> Result<FdtNode<'b, 'a>, DtbError> {
    fdt.all_nodes().next().ok_or(DtbError::Parse)
}

/// Raw value of property `name`.
pub fn prop<'a>(node: FdtNode<'_, 'a>, name: &str) -> Option<&'a [u8]> {
    node.properties().find(|p| p.name == name).map(|p| p.value)
}

/// A one-cell property; `BadValue(what)` if present but not four bytes.
pub fn prop_u32(node: FdtNode<'_, '_>, name: &str, what: &'static str) -> Result<Option<u32>, DtbError> {
    match prop(node, name) {
        None => Ok(None),
        Some(v) if v.len() == 4 => Ok(Some(u32::from_be_bytes([v[0], v[1], v[2], v[3]]))),
        Some(_) => Err(DtbError::BadValue(what)),
    }
}

/// The strings of a string-list value (`"a\0b\0"`). A trailing piece
/// without NUL is still returned; non-UTF-8 pieces are skipped.
pub fn strings(value: &[u8]) -> impl Iterator<Item = &str> {
    let empty = value.is_empty();
    let body = value.strip_suffix(&[0]).unwrap_or(value);
    body.split(|&b| b == 0).filter(move |_| !empty).filter_map(|s| core::str::from_utf8(s).ok())
}

/// First string of a string property.
pub fn prop_str<'a>(node: FdtNode<'_, 'a>, name: &str) -> Option<&'a str> {
    prop(node, name).and_then(|v| strings(v).next())
}

/// Does `compatible` list `what`?
pub fn is_compatible(node: FdtNode<'_, '_>, what: &str) -> bool {
    prop(node, "compatible").is_some_and(|v| strings(v).any(|s| s == what))
}

/// `status` absent, "okay" or "ok".
pub fn is_enabled(node: FdtNode<'_, '_>) -> bool {
    matches!(prop_str(node, "status"), None | Some("okay") | Some("ok"))
}

/// Big-endian cells → u32 array.
pub fn cells_u32(value: &[u8], what: &'static str) -> Result<Vec<u32>, DtbError> {
    if !value.len().is_multiple_of(4) {
        return Err(DtbError::BadValue(what));
    }
    Ok(value.chunks_exact(4).map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]])).collect())
}

/// Reads a number of `n` cells (0..=2) from the front of `cells`.
fn number(cells: &[u32], n: u32) -> u64 {
    cells.iter().take(n as usize).fold(0u64, |acc, &c| (acc << 32) | u64::from(c))
}

/// Decodes a `reg` value into regions. Needs `addr` 1..=2 and `size` 0..=2
/// cells (a larger count is a bus address we do not interpret).
pub fn regions(value: &[u8], cells: Cells, what: &'static str) -> Result<Vec<Region>, DtbError> {
    if !(1..=2).contains(&cells.addr) || cells.size > 2 {
        return Err(DtbError::BadValue(what));
    }
    let raw = cells_u32(value, what)?;
    let per = (cells.addr + cells.size) as usize;
    if raw.is_empty() || raw.len() % per != 0 {
        return Err(DtbError::BadValue(what));
    }
    Ok(raw
        .chunks_exact(per)
        .map(|c| Region { base: number(c, cells.addr), size: number(&c[cells.addr as usize..], cells.size) })
        .collect())
}

/// The node's `reg`, decoded with the cells it inherits.
pub fn reg(e: &Entry<'_, '_>, what: &'static str) -> Result<Vec<Region>, DtbError> {
    regions(prop(e.node, "reg").ok_or(DtbError::Missing(what))?, e.reg_cells, what)
}

/// Encodes `value` in `n` cells (1 or 2); `TooBig` if it does not fit.
pub fn encode(out: &mut Vec<u8>, value: u64, n: u32) -> Result<(), DtbError> {
    match n {
        1 => out.extend_from_slice(&u32::try_from(value).map_err(|_| DtbError::TooBig)?.to_be_bytes()),
        2 => out.extend_from_slice(&value.to_be_bytes()),
        0 if value == 0 => {}
        _ => return Err(DtbError::TooBig),
    }
    Ok(())
}

/// `reg` bytes for one region in the given cells.
pub fn encode_reg(r: &Region, cells: Cells) -> Result<Vec<u8>, DtbError> {
    let mut out = Vec::with_capacity(16);
    encode(&mut out, r.base, cells.addr)?;
    encode(&mut out, r.size, cells.size)?;
    Ok(out)
}

/// Cells a node declares for its children, falling back to `inherited`.
pub fn child_cells(node: FdtNode<'_, '_>, inherited: Cells) -> Result<Cells, DtbError> {
    Ok(Cells {
        addr: prop_u32(node, "#address-cells", "#address-cells")?.unwrap_or(inherited.addr),
        size: prop_u32(node, "#size-cells", "#size-cells")?.unwrap_or(inherited.size),
    })
}

impl<'b, 'a> Index<'b, 'a> {
    /// Indexes every node of a checked blob.
    pub fn new(fdt: &'b Fdt<'a>) -> Result<Self, DtbError> {
        let mut index = Index { entries: Vec::new(), paths: Vec::new() };
        let root = root(fdt)?;
        index.visit(root, String::from("/"), 1, None, ROOT_CELLS)?;
        Ok(index)
    }

    fn visit(
        &mut self,
        node: FdtNode<'b, 'a>,
        path: String,
        depth: usize,
        parent: Option<usize>,
        reg_cells: Cells,
    ) -> Result<(), DtbError> {
        // `blob::check` bounds the depth already; this keeps the recursion
        // obviously finite.
        if depth > MAX_DEPTH {
            return Err(DtbError::Unsupported("device tree nested too deep"));
        }
        let child_cells = child_cells(node, reg_cells)?;
        let phandle = match prop_u32(node, "phandle", "phandle")? {
            Some(p) => Some(p),
            None => prop_u32(node, "linux,phandle", "linux,phandle")?,
        };
        self.paths.push(path);
        let path_idx = self.paths.len() - 1;
        self.entries.push(Entry { node, path: path_idx, depth, parent, reg_cells, child_cells, phandle });
        for child in node.children() {
            let base = &self.paths[path_idx];
            let mut child_path = String::with_capacity(base.len() + child.name.len() + 1);
            child_path.push_str(base);
            if depth > 1 {
                child_path.push('/');
            }
            child_path.push_str(child.name);
            self.visit(child, child_path, depth + 1, Some(path_idx), child_cells)?;
        }
        Ok(())
    }

    pub fn path(&self, e: &Entry<'_, '_>) -> &str {
        &self.paths[e.path]
    }

    pub fn iter(&self) -> impl Iterator<Item = &Entry<'b, 'a>> {
        self.entries.iter()
    }

    /// Direct children of the node at index `i`.
    pub fn children_of(&self, i: usize) -> impl Iterator<Item = (usize, &Entry<'b, 'a>)> {
        let depth = self.entries[i].depth;
        self.entries
            .iter()
            .enumerate()
            .skip(i + 1)
            .take_while(move |(_, e)| e.depth > depth)
            .filter(move |(_, e)| e.depth == depth + 1)
    }

    /// Position of the first node with exactly this full path, or — as a
    /// fallback for paths that leave out unit addresses — whose path matches
    /// component by component ignoring `@unit` on the tree side.
    pub fn find(&self, path: &str) -> Option<usize> {
        let path = if path.len() > 1 { path.trim_end_matches('/') } else { path };
        if let Some(i) = self.paths.iter().position(|p| p == path) {
            return Some(i);
        }
        let want: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        self.paths.iter().position(|p| {
            let have: Vec<&str> = p.split('/').filter(|s| !s.is_empty()).collect();
            have.len() == want.len()
                && have.iter().zip(&want).all(|(h, w)| h == w || (!w.contains('@') && h.split('@').next() == Some(w)))
        })
    }

    /// Resolves a path that may start with an alias (`serial0`, `serial0/x`).
    pub fn resolve(&self, path: &str) -> Option<usize> {
        if path.starts_with('/') {
            return self.find(path);
        }
        let (alias, rest) = match path.split_once('/') {
            Some((a, r)) => (a, Some(r)),
            None => (path, None),
        };
        let aliases = self.find("/aliases")?;
        let target = prop_str(self.entries[aliases].node, alias)?;
        // An alias must name an absolute path: this also stops alias loops.
        if !target.starts_with('/') {
            return None;
        }
        match rest {
            None => self.find(target),
            Some(rest) => {
                let mut full = String::from(target.trim_end_matches('/'));
                full.push('/');
                full.push_str(rest);
                self.find(&full)
            }
        }
    }
}

/// What the GIC binding's 3-cell interrupt specifier says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Irq {
    pub intid: IntId,
    pub edge: bool,
}

/// Decodes one GICv3 interrupt specifier `<type number flags>`:
/// type 0 = SPI (INTID n+32), 1 = PPI (n+16), 2 = extended SPI (n+4096),
/// 3 = extended PPI (n+1056); flags 1/2 = edge, 4/8 = level.
pub fn gic_irq(spec: &[u32]) -> Result<Irq, DtbError> {
    let [kind, n, flags] = spec else {
        return Err(DtbError::BadValue("interrupt specifier is not 3 cells"));
    };
    let intid = match *kind {
        0 => IntId::spi(*n),
        1 => IntId::ppi(*n),
        2 => IntId::espi(*n),
        3 => IntId::eppi(*n),
        _ => return Err(DtbError::BadValue("interrupt specifier")),
    }
    .map_err(|_| DtbError::BadValue("interrupt specifier"))?;
    Ok(Irq { intid, edge: flags & 0x3 != 0 })
}

/// Most bus levels an address is translated through, and most interrupt
/// parents or nexus maps followed for one interrupt: far more than any real
/// tree needs, and a bound on loops through `interrupt-parent`.
const MAX_HOPS: usize = MAX_DEPTH;

impl Index<'_, '_> {
    /// The node with this phandle.
    pub fn by_phandle(&self, phandle: u32) -> Option<usize> {
        self.entries.iter().position(|e| e.phandle == Some(phandle))
    }

    /// Translates `r`, given in the address space of node `i`'s parent bus,
    /// to a CPU physical address through every ancestor bus's `ranges`
    /// (each level with its own cell counts). An empty `ranges` is the
    /// identity; a bus without `ranges` is not memory-mapped, so its
    /// children's `reg` cannot be translated (`Unsupported`).
    pub fn translate(&self, i: usize, r: Region) -> Result<Region, DtbError> {
        let mut base = r.base;
        let mut bus = self.entries[i].parent;
        for _ in 0..MAX_HOPS {
            // The root's address space is the CPU's.
            let Some(b) = bus.filter(|&b| self.entries[b].parent.is_some()) else {
                return Ok(Region { base, size: r.size });
            };
            let e = &self.entries[b];
            let ranges = prop(e.node, "ranges").ok_or(DtbError::Unsupported("reg behind a bus without ranges"))?;
            if !ranges.is_empty() {
                base = through_ranges(ranges, e, base, r.size)?;
            }
            bus = e.parent;
        }
        Err(DtbError::Unsupported("device tree nested too deep"))
    }

    /// Node `i`'s `reg`, translated to CPU physical addresses.
    pub fn mmio_reg(&self, i: usize, what: &'static str) -> Result<Vec<Region>, DtbError> {
        reg(&self.entries[i], what)?.into_iter().map(|r| self.translate(i, r)).collect()
    }

    /// The interrupt parent of node `i`: the first node, following
    /// `interrupt-parent` where present and the tree parent elsewhere, that
    /// has `#interrupt-cells` (as Linux's `of_irq_find_parent`). A tree
    /// that names no interrupt parent at all gets `default` (the GIC: the
    /// only controller we drive, and what the hypervisor assumed before it
    /// read `interrupt-parent`).
    pub fn irq_parent(&self, i: usize, default: usize) -> Result<usize, DtbError> {
        let mut cur = i;
        for _ in 0..MAX_HOPS {
            let next = match prop_u32(self.entries[cur].node, "interrupt-parent", "interrupt-parent")? {
                Some(ph) => self.by_phandle(ph).ok_or(DtbError::BadValue("interrupt-parent names no node"))?,
                None => match self.entries[cur].parent {
                    Some(p) => p,
                    None => return Ok(default),
                },
            };
            if prop(self.entries[next].node, "#interrupt-cells").is_some() {
                return Ok(next);
            }
            cur = next;
        }
        Err(DtbError::Unsupported("interrupt-parent chain too long"))
    }

    /// All interrupts of node `i`, resolved through any `interrupt-map`
    /// nexus to the GIC (node `gic`) and decoded to INTIDs: from
    /// `interrupts-extended` (`<phandle spec…>` pairs) when present, else
    /// from `interrupts` read with the interrupt parent's `#interrupt-cells`.
    pub fn irqs(&self, i: usize, gic: usize, what: &'static str) -> Result<Vec<Irq>, DtbError> {
        let e = &self.entries[i];
        // The unit address an interrupt-map matches on: the start of `reg`.
        let addr = match prop(e.node, "reg") {
            Some(v) => cells_u32(v, what)?,
            None => Vec::new(),
        };
        if let Some(v) = prop(e.node, "interrupts-extended") {
            let raw = cells_u32(v, what)?;
            let mut out = Vec::new();
            let mut pos = 0;
            while pos < raw.len() {
                let parent =
                    self.by_phandle(raw[pos]).ok_or(DtbError::BadValue("interrupts-extended names no node"))?;
                let n = self.interrupt_cells(parent)?;
                let spec = raw.get(pos + 1..pos + 1 + n).ok_or(DtbError::BadValue(what))?;
                out.push(self.map_irq(parent, &addr, spec, gic)?);
                pos += 1 + n;
            }
            if out.is_empty() {
                return Err(DtbError::BadValue(what));
            }
            return Ok(out);
        }
        let raw = cells_u32(prop(e.node, "interrupts").ok_or(DtbError::Missing(what))?, what)?;
        let parent = self.irq_parent(i, gic)?;
        let n = self.interrupt_cells(parent)?;
        if raw.is_empty() || raw.len() % n != 0 {
            return Err(DtbError::BadValue(what));
        }
        raw.chunks_exact(n).map(|spec| self.map_irq(parent, &addr, spec, gic)).collect()
    }

    fn interrupt_cells(&self, i: usize) -> Result<usize, DtbError> {
        match prop_u32(self.entries[i].node, "#interrupt-cells", "#interrupt-cells")? {
            Some(n @ 1..=4) => Ok(n as usize),
            Some(_) => Err(DtbError::Unsupported("#interrupt-cells above 4")),
            None => Err(DtbError::Missing("#interrupt-cells of an interrupt parent")),
        }
    }

    /// Follows one interrupt specifier from controller/nexus `ctrl` to the
    /// GIC. `addr` is the child unit address (zero-padded to the width the
    /// nexus wants), `spec` the specifier in `ctrl`'s `#interrupt-cells`.
    fn map_irq(&self, mut ctrl: usize, addr: &[u32], spec: &[u32], gic: usize) -> Result<Irq, DtbError> {
        let mut addr: Vec<u32> = addr.to_vec();
        let mut spec: Vec<u32> = spec.to_vec();
        // The first nexus matches on the device's address in the width the
        // nexus gives its children (inherited, as Linux does); later ones on
        // the width the map entry used, i.e. the parent's own
        // `#address-cells`.
        let mut addr_cells = self.entries[ctrl].child_cells.addr as usize;
        for _ in 0..MAX_HOPS {
            if ctrl == gic {
                return gic_irq(&spec);
            }
            let node = self.entries[ctrl].node;
            let Some(map) = prop(node, "interrupt-map") else {
                if prop(node, "interrupt-controller").is_some() {
                    return Err(DtbError::Unsupported("interrupt controller other than the GIC"));
                }
                // Neither a controller nor a nexus: pass the specifier up.
                ctrl = self.irq_parent(ctrl, gic)?;
                addr_cells = self.entries[ctrl].child_cells.addr as usize;
                continue;
            };
            let map = cells_u32(map, "interrupt-map")?;
            addr.resize(addr_cells, 0);
            let (next, next_addr, next_spec) = self.map_lookup(ctrl, &map, &addr, &spec)?;
            addr_cells = next_addr.len();
            ctrl = next;
            addr = next_addr;
            spec = next_spec;
        }
        Err(DtbError::Unsupported("interrupt-map chain too long"))
    }

    /// Finds `addr ++ spec` (masked by `interrupt-map-mask`) in nexus
    /// `ctrl`'s `interrupt-map`; returns the parent and its unit address and
    /// specifier.
    fn map_lookup(
        &self,
        ctrl: usize,
        map: &[u32],
        addr: &[u32],
        spec: &[u32],
    ) -> Result<(usize, Vec<u32>, Vec<u32>), DtbError> {
        let node = self.entries[ctrl].node;
        let key: Vec<u32> = addr.iter().chain(spec).copied().collect();
        let mask = match prop(node, "interrupt-map-mask") {
            Some(m) => cells_u32(m, "interrupt-map-mask")?,
            None => alloc::vec![u32::MAX; key.len()],
        };
        if mask.len() != key.len() {
            return Err(DtbError::BadValue("interrupt-map-mask width"));
        }
        let matches = |child: &[u32]| child.iter().zip(&key).zip(&mask).all(|((c, k), m)| c & m == k & m);
        for m in self.map_entries(map, key.len())? {
            if matches(&m.child) {
                return Ok((m.parent, m.parent_addr, m.parent_spec));
            }
        }
        Err(DtbError::BadValue("interrupt-map has no entry for an interrupt"))
    }

    /// Decodes an `interrupt-map` whose child part (unit address and
    /// specifier) is `key_len` cells wide. Each entry's parent part is as
    /// wide as that parent's own `#address-cells` (0 when absent) and
    /// `#interrupt-cells` say.
    fn map_entries(&self, map: &[u32], key_len: usize) -> Result<Vec<MapEntry>, DtbError> {
        let bad = DtbError::BadValue("interrupt-map entry");
        let mut out = Vec::new();
        let mut pos = 0;
        while pos < map.len() {
            let child = map.get(pos..pos + key_len).ok_or(bad)?;
            let ph = *map.get(pos + key_len).ok_or(bad)?;
            let parent = self.by_phandle(ph).ok_or(DtbError::BadValue("interrupt-map names no node"))?;
            let pa = prop_u32(self.entries[parent].node, "#address-cells", "#address-cells")?.unwrap_or(0) as usize;
            let pi = self.interrupt_cells(parent)?;
            let start = pos + key_len + 1;
            let entry = map.get(start..start + pa + pi).ok_or(bad)?;
            out.push(MapEntry {
                child: child.to_vec(),
                parent,
                parent_addr: entry[..pa].to_vec(),
                parent_spec: entry[pa..].to_vec(),
            });
            pos = start + pa + pi;
        }
        Ok(out)
    }

    /// Every interrupt nexus node `i`'s `interrupt-map` can route to,
    /// resolved to the GIC (node `gic`), distinct, in map order: for a PCI
    /// host bridge, the INTx lines of all slots. A map that reaches another
    /// controller is `Unsupported`, as for a device's own interrupts.
    pub fn interrupt_map_targets(&self, i: usize, gic: usize) -> Result<Vec<Irq>, DtbError> {
        let e = &self.entries[i];
        let map = cells_u32(prop(e.node, "interrupt-map").ok_or(DtbError::Missing("interrupt-map"))?, "interrupt-map")?;
        let key_len = e.child_cells.addr as usize + self.interrupt_cells(i)?;
        let mut out: Vec<Irq> = Vec::new();
        for m in self.map_entries(&map, key_len)? {
            let irq = self.map_irq(m.parent, &m.parent_addr, &m.parent_spec, gic)?;
            if !out.iter().any(|o| o.intid == irq.intid) {
                out.push(irq);
            }
        }
        Ok(out)
    }
}

/// One decoded `interrupt-map` entry.
struct MapEntry {
    /// Child unit address and specifier (unmasked).
    child: Vec<u32>,
    /// The interrupt parent's node index.
    parent: usize,
    parent_addr: Vec<u32>,
    parent_spec: Vec<u32>,
}

/// `addr` (with `size` bytes behind it) in bus `bus`'s child address space,
/// translated through its non-empty `ranges` to the bus's own parent space.
fn through_ranges(ranges: &[u8], bus: &Entry<'_, '_>, addr: u64, size: u64) -> Result<u64, DtbError> {
    let (ca, pa, sc) = (bus.child_cells.addr, bus.reg_cells.addr, bus.child_cells.size);
    if !(1..=2).contains(&ca) || !(1..=2).contains(&pa) || !(1..=2).contains(&sc) {
        return Err(DtbError::Unsupported("ranges with more than 2 address or size cells"));
    }
    let raw = cells_u32(ranges, "ranges")?;
    let per = (ca + pa + sc) as usize;
    if raw.len() % per != 0 {
        return Err(DtbError::BadValue("ranges"));
    }
    for c in raw.chunks_exact(per) {
        let child = number(c, ca);
        let parent = number(&c[ca as usize..], pa);
        let len = number(&c[(ca + pa) as usize..], sc);
        let Some(off) = addr.checked_sub(child) else {
            continue;
        };
        if off < len && off.checked_add(size).is_some_and(|end| end <= len) {
            return parent.checked_add(off).ok_or(DtbError::TooBig);
        }
    }
    Err(DtbError::BadValue("reg outside its bus's ranges"))
}
