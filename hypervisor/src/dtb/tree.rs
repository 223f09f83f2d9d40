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
    /// Cells that this node's own `reg` is encoded with (the parent's).
    pub reg_cells: Cells,
    /// Effective `interrupt-parent` phandle (own or inherited).
    pub irq_parent: Option<u32>,
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
        index.visit(root, String::from("/"), 1, ROOT_CELLS, None)?;
        Ok(index)
    }

    fn visit(
        &mut self,
        node: FdtNode<'b, 'a>,
        path: String,
        depth: usize,
        reg_cells: Cells,
        irq_parent: Option<u32>,
    ) -> Result<(), DtbError> {
        // `blob::check` bounds the depth already; this keeps the recursion
        // obviously finite.
        if depth > MAX_DEPTH {
            return Err(DtbError::Unsupported("device tree nested too deep"));
        }
        let child_cells = child_cells(node, reg_cells)?;
        let irq_parent = prop_u32(node, "interrupt-parent", "interrupt-parent")?.or(irq_parent);
        self.paths.push(path);
        let path_idx = self.paths.len() - 1;
        self.entries.push(Entry { node, path: path_idx, depth, reg_cells, irq_parent });
        for child in node.children() {
            let base = &self.paths[path_idx];
            let mut child_path = String::with_capacity(base.len() + child.name.len() + 1);
            child_path.push_str(base);
            if depth > 1 {
                child_path.push('/');
            }
            child_path.push_str(child.name);
            self.visit(child, child_path, depth + 1, child_cells, irq_parent)?;
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

/// All interrupts of a node whose parent is the GIC, as INTIDs.
pub fn gic_irqs(e: &Entry<'_, '_>, gic_phandle: Option<u32>, what: &'static str) -> Result<Vec<Irq>, DtbError> {
    if let (Some(p), Some(g)) = (e.irq_parent, gic_phandle) {
        if p != g {
            return Err(DtbError::Unsupported("interrupt parent is not the GIC"));
        }
    }
    let raw = cells_u32(prop(e.node, "interrupts").ok_or(DtbError::Missing(what))?, what)?;
    if raw.is_empty() || raw.len() % 3 != 0 {
        return Err(DtbError::BadValue(what));
    }
    raw.chunks_exact(3).map(gic_irq).collect()
}
