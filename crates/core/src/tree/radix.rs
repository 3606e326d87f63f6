//! One radix tree (one shard of one model) stored in an arena.
//!
//! Nodes live in a `Vec<Node>` addressed by `u32` indices, with a free list
//! of recycled slots; the root is slot 0 and has an empty edge. Each node
//! remembers which backends were sent the text ending inside or below it,
//! and when (a logical tick). Invariant: a backend on a node is on all its
//! ancestors, with a tick at least as recent.
//!
//! This module does matching and recording only. It is not thread safe by
//! itself (the caller holds the shard lock) and it does no eviction (see
//! `evict.rs`) and no budgeting beyond keeping the per-backend byte counts.

use smallvec::SmallVec;

use super::Matches;
use super::text::Cursor;
use crate::BackendId;

/// Index of the root node in every arena.
pub(crate) const ROOT: u32 = 0;
/// `parent` value marking a slot on the free list.
pub(crate) const FREE: u32 = u32::MAX;

/// One backend's presence on a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    pub(crate) backend: BackendId,
    /// Logical time of the last route/insert that passed through the node.
    pub(crate) tick: u64,
}

/// A tree node.
///
/// Size: 88 bytes on 64-bit targets (edge 16, children 24 with two inline,
/// backends 40 with two entries inline, parent 4 + padding; checked by a
/// test), plus the edge bytes in their own allocation, 8 bytes per child
/// beyond two and 16 bytes per backend entry beyond two.
#[derive(Debug, Default)]
pub(crate) struct Node {
    /// The bytes on the edge from the parent to this node; empty only for the root.
    pub(crate) edge: Box<[u8]>,
    /// Children sorted by the first byte of their edge.
    pub(crate) children: Children,
    /// Backends on this node, each once, sorted by backend id.
    pub(crate) backends: SmallVec<[Entry; 2]>,
    /// Parent index; [`ROOT`] for the root itself, [`FREE`] for a free slot.
    pub(crate) parent: u32,
}

/// Child list: (first edge byte, node index), sorted by byte; up to 256.
pub(crate) type Children = SmallVec<[(u8, u32); 2]>;

/// Where a walk down the tree stopped.
#[derive(Debug, Default)]
pub(crate) struct Walk {
    /// Nodes entered from the root, in order (the root excluded).
    pub(crate) path: SmallVec<[u32; 32]>,
    /// `Some(k)` when only the first `k` bytes of the last path node's edge matched.
    pub(crate) split: Option<usize>,
}

/// One radix tree in an arena, with per-backend byte usage.
#[derive(Debug)]
pub(crate) struct Radix {
    pub(crate) nodes: Vec<Node>,
    pub(crate) free: Vec<u32>,
    /// Per backend, sum of edge lengths of the nodes it is on; sorted by id, no zeros.
    pub(crate) usage: Vec<(BackendId, usize)>,
    /// Sum of edge lengths of live nodes.
    pub(crate) bytes: usize,
    /// Live nodes, the root excluded.
    pub(crate) live: usize,
}

impl Radix {
    /// Bytes this shard holds on the heap (allocator overhead excluded).
    pub(crate) fn heap_bytes(&self) -> usize {
        use std::mem::size_of;
        let spilled = |n: &Node| {
            let children = if n.children.spilled() {
                n.children.capacity()
            } else {
                0
            };
            let backends = if n.backends.spilled() {
                n.backends.capacity()
            } else {
                0
            };
            n.edge.len() + children * size_of::<(u8, u32)>() + backends * size_of::<Entry>()
        };
        self.nodes.capacity() * size_of::<Node>()
            + self.nodes.iter().map(spilled).sum::<usize>()
            + self.free.capacity() * size_of::<u32>()
            + self.usage.capacity() * size_of::<(BackendId, usize)>()
    }
}

impl Default for Radix {
    fn default() -> Self {
        Radix {
            nodes: vec![Node::default()],
            free: Vec::new(),
            usage: Vec::new(),
            bytes: 0,
            live: 0,
        }
    }
}

impl Radix {
    /// True when the tree holds nothing but its root.
    pub(crate) fn is_empty(&self) -> bool {
        self.live == 0
    }

    /// The child of `node` whose edge starts with `byte`.
    fn child(&self, node: u32, byte: u8) -> Option<u32> {
        let children = &self.nodes[node as usize].children;
        children
            .binary_search_by_key(&byte, |&(k, _)| k)
            .ok()
            .map(|i| children[i].1)
    }

    /// Walk the text at `cur` down from the root, noting in `matches` the
    /// depth reached on each node for each backend present there, and the depth of
    /// the deepest fully matched node with more than one child (`shared`) and with at
    /// least `hot_children` children (`hot`).
    pub(crate) fn walk<P: AsRef<[u8]>>(
        &self,
        cur: &mut Cursor<'_, P>,
        matches: &mut Matches,
        hot_children: usize,
    ) -> Walk {
        let mut walk = Walk::default();
        let mut node = ROOT;
        while let Some(byte) = cur.peek() {
            let Some(child) = self.child(node, byte) else {
                break;
            };
            let n = &self.nodes[child as usize];
            let k = cur.match_edge(&n.edge);
            walk.path.push(child);
            matches.note(&n.backends, cur.consumed());
            if k < n.edge.len() {
                walk.split = Some(k);
                break;
            }
            if n.children.len() > 1 {
                matches.shared = cur.consumed();
            }
            if n.children.len() >= hot_children {
                matches.hot = cur.consumed();
            }
            node = child;
        }
        walk
    }

    /// Record the text walked by `walk` (with `cur` where the walk stopped)
    /// under `backend` at `tick`: split the last edge if the text left it
    /// midway, touch every path node, add a leaf for the unmatched rest.
    pub(crate) fn record<P: AsRef<[u8]>>(
        &mut self,
        walk: &Walk,
        cur: &Cursor<'_, P>,
        backend: BackendId,
        tick: u64,
    ) {
        let last = walk.path.last().copied().unwrap_or(ROOT);
        if let Some(k) = walk.split
            && !self.split(last, k)
        {
            return;
        }
        for &node in &walk.path {
            self.touch(node, backend, tick);
        }
        if cur.remaining() > 0 {
            self.add_leaf(last, cur.copy_rest(), backend, tick);
        }
    }

    /// Mark `backend` on `node` at `tick` (keeping a newer tick if present).
    fn touch(&mut self, node: u32, backend: BackendId, tick: u64) {
        let n = &mut self.nodes[node as usize];
        let pos = match n.backends.binary_search_by_key(&backend, |e| e.backend) {
            Ok(i) => {
                n.backends[i].tick = n.backends[i].tick.max(tick);
                return;
            }
            Err(pos) => pos,
        };
        n.backends.insert(pos, Entry { backend, tick });
        let len = n.edge.len();
        self.add_usage(backend, len);
    }

    /// Split `node`'s edge after `k` bytes: `node` keeps the first `k` bytes
    /// and gets one new child holding the rest, its children and a copy of
    /// its backends. Returns false (tree unchanged) if the arena is full.
    fn split(&mut self, node: u32, k: usize) -> bool {
        let n = &self.nodes[node as usize];
        let Some(&first) = n.edge.get(k) else {
            return true;
        };
        let lower = Node {
            edge: n.edge[k..].into(),
            children: Children::new(),
            backends: n.backends.clone(),
            parent: node,
        };
        let Some(idx) = self.alloc(lower) else {
            return false;
        };
        let n = &mut self.nodes[node as usize];
        // The lower half's bytes were counted by `alloc`; the upper half loses them.
        self.bytes -= n.edge.len() - k;
        n.edge = n.edge[..k].into();
        let mut only = Children::new();
        only.push((first, idx));
        let children = std::mem::replace(&mut n.children, only);
        for &(_, c) in &children {
            self.nodes[c as usize].parent = idx;
        }
        self.nodes[idx as usize].children = children;
        true
    }

    /// Add a leaf with `edge` (non-empty) under `parent`, owned by `backend`.
    fn add_leaf(&mut self, parent: u32, edge: Box<[u8]>, backend: BackendId, tick: u64) {
        let Some(&first) = edge.first() else {
            return;
        };
        let children = &self.nodes[parent as usize].children;
        let Err(pos) = children.binary_search_by_key(&first, |&(k, _)| k) else {
            return;
        };
        let len = edge.len();
        let mut backends = SmallVec::new();
        backends.push(Entry { backend, tick });
        let leaf = Node {
            edge,
            children: Children::new(),
            backends,
            parent,
        };
        let Some(idx) = self.alloc(leaf) else {
            return;
        };
        self.nodes[parent as usize]
            .children
            .insert(pos, (first, idx));
        self.add_usage(backend, len);
    }

    /// Put `node` in a free slot (or a new one); `None` if indices ran out.
    fn alloc(&mut self, node: Node) -> Option<u32> {
        self.bytes += node.edge.len();
        self.live += 1;
        if let Some(idx) = self.free.pop() {
            self.nodes[idx as usize] = node;
            return Some(idx);
        }
        match u32::try_from(self.nodes.len()) {
            Ok(idx) if idx != FREE => {
                self.nodes.push(node);
                Some(idx)
            }
            _ => {
                self.bytes -= node.edge.len();
                self.live -= 1;
                None
            }
        }
    }

    /// Add `len` bytes to `backend`'s usage.
    pub(crate) fn add_usage(&mut self, backend: BackendId, len: usize) {
        match self.usage.binary_search_by_key(&backend, |&(b, _)| b) {
            Ok(i) => self.usage[i].1 += len,
            Err(i) => self.usage.insert(i, (backend, len)),
        }
    }

    /// Remove `len` bytes from `backend`'s usage, dropping zero entries.
    pub(crate) fn sub_usage(&mut self, backend: BackendId, len: usize) {
        if let Ok(i) = self.usage.binary_search_by_key(&backend, |&(b, _)| b) {
            let left = self.usage[i].1.saturating_sub(len);
            if left == 0 {
                self.usage.remove(i);
            } else {
                self.usage[i].1 = left;
            }
        }
    }
}
