//! Consistency checks of the arenas, for tests only.
//!
//! Verifies links, the backend ancestor invariant, tick order and that the
//! incremental counters equal a recount. Not used at run time.

use std::collections::BTreeMap;

use super::PrefixTrees;
use super::radix::{FREE, ROOT, Radix};
use crate::BackendId;

impl PrefixTrees {
    /// Check every shard of every model; the first problem found, if any.
    pub(crate) fn check_invariants(&self) -> Result<(), String> {
        for (name, tree) in self.models.read().iter() {
            for (i, shard) in tree.shards.iter().enumerate() {
                shard
                    .lock()
                    .check()
                    .map_err(|e| format!("model {name:?} shard {i}: {e}"))?;
            }
        }
        Ok(())
    }
}

impl Radix {
    /// Check this arena.
    fn check(&self) -> Result<(), String> {
        let root = self.nodes.first().ok_or("no root")?;
        if root.parent != ROOT || !root.edge.is_empty() || !root.backends.is_empty() {
            return Err("bad root".into());
        }
        let mut usage: BTreeMap<BackendId, usize> = BTreeMap::new();
        let (mut live, mut bytes) = (0, 0);
        for (i, node) in self.nodes.iter().enumerate().skip(1) {
            if node.parent == FREE {
                self.check_free(i)?;
                continue;
            }
            self.check_node(i)?;
            live += 1;
            bytes += node.edge.len();
            for e in &node.backends {
                *usage.entry(e.backend).or_default() += node.edge.len();
            }
        }
        self.check_children(0)?;
        if live != self.live || bytes != self.bytes {
            return Err(format!(
                "live {live}/{} bytes {bytes}/{}",
                self.live, self.bytes
            ));
        }
        if self.free.len() != self.nodes.len() - 1 - live {
            return Err("free list length differs from free slots".into());
        }
        if self.reachable() != live {
            return Err("unreachable live nodes".into());
        }
        let counted: Vec<(BackendId, usize)> = usage.into_iter().filter(|u| u.1 > 0).collect();
        if counted != self.usage {
            return Err(format!("usage {:?} != recount {counted:?}", self.usage));
        }
        Ok(())
    }

    /// A free slot is empty and on the free list.
    fn check_free(&self, i: usize) -> Result<(), String> {
        let n = &self.nodes[i];
        let listed = self.free.iter().any(|&f| f as usize == i);
        if !n.edge.is_empty() || !n.children.is_empty() || !n.backends.is_empty() || !listed {
            return Err(format!("free slot {i} not clean or not listed"));
        }
        Ok(())
    }

    /// Links, edge, backends and ticks of live node `i`.
    fn check_node(&self, i: usize) -> Result<(), String> {
        let n = &self.nodes[i];
        let parent = self
            .nodes
            .get(n.parent as usize)
            .ok_or("parent out of range")?;
        let first = *n
            .edge
            .first()
            .ok_or(format!("node {i} has an empty edge"))?;
        if !parent
            .children
            .iter()
            .any(|&(k, c)| c as usize == i && k == first)
        {
            return Err(format!("node {i} missing from its parent's children"));
        }
        if n.backends.is_empty() {
            return Err(format!("node {i} has no backend"));
        }
        if !n.backends.windows(2).all(|w| w[0].backend < w[1].backend) {
            return Err(format!("backends of node {i} not sorted or repeated"));
        }
        for e in &n.backends {
            if n.parent != ROOT {
                let up = parent.backends.iter().find(|p| p.backend == e.backend);
                if up.is_none_or(|p| p.tick < e.tick) {
                    return Err(format!("node {i}: {:?} not on parent or newer", e.backend));
                }
            }
        }
        self.check_children(i)
    }

    /// Children of `i` sorted, unique, pointing back to `i`.
    fn check_children(&self, i: usize) -> Result<(), String> {
        let n = &self.nodes[i];
        if !n.children.windows(2).all(|w| w[0].0 < w[1].0) {
            return Err(format!("children of {i} not sorted"));
        }
        for &(k, c) in &n.children {
            let child = self.nodes.get(c as usize).ok_or("child out of range")?;
            if child.parent as usize != i || child.edge.first() != Some(&k) {
                return Err(format!("child {c} of {i} has a bad parent or key"));
            }
        }
        Ok(())
    }

    /// Number of nodes reachable from the root, the root excluded.
    fn reachable(&self) -> usize {
        let mut stack = vec![ROOT];
        let mut seen = 0;
        while let Some(i) = stack.pop() {
            if seen > self.nodes.len() {
                break; // a cycle; the count check then fails
            }
            let children = &self.nodes[i as usize].children;
            seen += children.len();
            stack.extend(children.iter().map(|&(_, c)| c));
        }
        seen
    }
}
