//! Keeping the trees within budget: LRU eviction and dropping backends.
//!
//! Eviction works per backend and globally (across models and shards): for
//! each backend over its byte budget it finds the tick cutoff that frees at
//! least the excess, then removes the backend from every node last touched
//! at or before it. Because an ancestor's tick is never older than its
//! descendants', this keeps the ancestor invariant. Nodes no backend is on
//! any more are removed with their subtrees and their slots recycled.
//!
//! Shard locks are taken one at a time, never two at once. This module does
//! not decide when to evict (the caller asks [`PrefixTrees::eviction_due`] or
//! [`PrefixTrees::over_budget`]),
//! and it does not merge single-child chains left behind by removals.

use smallvec::SmallVec;

use super::radix::{Entry, FREE, ROOT, Radix};
use super::{ModelMap, PrefixTrees, add_to};
use crate::BackendId;

/// What [`PrefixTrees::evict`] or [`PrefixTrees::retain_backends`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EvictReport {
    /// Text bytes freed: sum of edge lengths of the nodes removed.
    pub bytes_removed: usize,
    /// Nodes removed.
    pub nodes_removed: usize,
    /// Per backend, budget bytes released (edge lengths of the nodes it left), by id.
    pub per_backend: Vec<(BackendId, usize)>,
    /// Model trees dropped because they became empty.
    pub models_removed: usize,
}

/// Per over-budget backend (sorted by id): the bytes to free, then the cutoff tick.
type EvictionPlan = Vec<(BackendId, usize, u64)>;

impl PrefixTrees {
    /// Evict least-recently-used entries of every backend over its byte budget, down to the budget;
    /// drop nodes no backend is on any more; drop empty model trees. Returns what it did.
    pub fn evict(&self) -> EvictReport {
        self.grown.store(0, std::sync::atomic::Ordering::Relaxed);
        let mut plan: EvictionPlan = (self.usage_totals().into_iter())
            .filter_map(|(b, used)| Some((b, used.checked_sub(self.budget_bytes(b))?, 0)))
            .filter(|&(_, excess, _)| excess > 0)
            .collect();
        let mut report = EvictReport::default();
        if !plan.is_empty() {
            self.set_cutoffs(&mut plan);
            self.remove_everywhere(&mut report, |e| {
                plan.binary_search_by_key(&e.backend, |&(b, _, _)| b)
                    .is_ok_and(|i| e.tick <= plan[i].2)
            });
        }
        report.models_removed = self.drop_empty_models();
        log::debug!("prefix tree eviction: {report:?}");
        report
    }

    /// Drop every entry of backends for which `keep` is false (backend removed from the fleet),
    /// prune the nodes left empty and drop empty model trees. Walks the trees only when some
    /// backend in them is to be dropped.
    pub fn retain_backends(&self, keep: impl Fn(BackendId) -> bool) {
        if self.usage_totals().iter().all(|&(b, _)| keep(b)) {
            return;
        }
        let mut report = EvictReport::default();
        self.remove_everywhere(&mut report, |e| !keep(e.backend));
        report.models_removed = self.drop_empty_models();
        log::debug!("prefix tree backends dropped: {report:?}");
    }

    /// Fill in each planned backend's cutoff tick from the (tick, bytes) of
    /// every node it is on.
    fn set_cutoffs(&self, plan: &mut EvictionPlan) {
        let mut ticks: Vec<Vec<(u64, usize)>> = vec![Vec::new(); plan.len()];
        for tree in self.trees() {
            for shard in tree.shards.iter() {
                shard.lock().collect_ticks(plan, &mut ticks);
            }
        }
        for (step, list) in plan.iter_mut().zip(ticks) {
            step.2 = cutoff(list, step.1);
        }
    }

    /// Remove every entry for which `drop` is true, then prune, shard by shard.
    fn remove_everywhere(&self, report: &mut EvictReport, drop: impl Fn(&Entry) -> bool) {
        for tree in self.trees() {
            for shard in tree.shards.iter() {
                let mut edges = Vec::new();
                let mut radix = shard.lock();
                radix.remove_entries(&drop, &mut report.per_backend);
                let (nodes, bytes) = radix.prune(&mut edges);
                std::mem::drop(radix);
                // Freeing the text is the slow part: do it outside the lock.
                std::mem::drop(edges);
                report.nodes_removed += nodes;
                report.bytes_removed += bytes;
            }
        }
    }

    /// Remove model trees holding nothing; returns how many.
    fn drop_empty_models(&self) -> usize {
        let empty = |m: &ModelMap| {
            m.values()
                .filter(|t| t.shards.iter().all(|s| s.lock().is_empty()))
                .count()
        };
        if empty(&self.models.read()) == 0 {
            return 0;
        }
        let mut models = self.models.write();
        let before = models.len();
        models.retain(|_, t| !t.shards.iter().all(|s| s.lock().is_empty()));
        before - models.len()
    }
}

/// The tick T such that the entries with tick <= T sum to at least `excess`
/// bytes (all of them if they sum to less).
fn cutoff(mut ticks: Vec<(u64, usize)>, excess: usize) -> u64 {
    ticks.sort_unstable();
    let mut freed = 0usize;
    for &(tick, len) in &ticks {
        freed += len;
        if freed >= excess {
            return tick;
        }
    }
    ticks.last().map_or(0, |&(tick, _)| tick)
}

impl Radix {
    /// Append (tick, edge length) of each node to the list of each planned backend on it.
    fn collect_ticks(&self, plan: &EvictionPlan, out: &mut [Vec<(u64, usize)>]) {
        for node in self.nodes.iter().skip(1).filter(|n| n.parent != FREE) {
            for e in &node.backends {
                if let Ok(i) = plan.binary_search_by_key(&e.backend, |&(b, _, _)| b)
                    && let Some(list) = out.get_mut(i)
                {
                    list.push((e.tick, node.edge.len()));
                }
            }
        }
    }

    /// Remove the entries for which `drop` is true, adding the bytes each
    /// backend releases to `released`.
    fn remove_entries(
        &mut self,
        drop: &impl Fn(&Entry) -> bool,
        released: &mut Vec<(BackendId, usize)>,
    ) {
        let mut gone: SmallVec<[(BackendId, usize); 8]> = SmallVec::new();
        for i in 1..self.nodes.len() {
            let node = &mut self.nodes[i];
            if node.parent == FREE || !node.backends.iter().any(drop) {
                continue;
            }
            let len = node.edge.len();
            for e in node.backends.iter().filter(|e| drop(e)) {
                gone.push((e.backend, len));
            }
            node.backends.retain(|e| !drop(e));
            for (b, len) in gone.drain(..) {
                self.sub_usage(b, len);
                add_to(released, b, len);
            }
        }
    }

    /// Remove every node no backend is on, with its whole subtree; recycle
    /// the slots. The removed edges go to `edges` for the caller to free
    /// after unlocking. Returns (nodes removed, edge bytes removed).
    pub(crate) fn prune(&mut self, edges: &mut Vec<Box<[u8]>>) -> (usize, usize) {
        let tops: Vec<u32> = (1..self.nodes.len())
            .filter(|&i| {
                let n = &self.nodes[i];
                n.parent != FREE
                    && n.backends.is_empty()
                    && (n.parent == ROOT || !self.nodes[n.parent as usize].backends.is_empty())
            })
            .filter_map(|i| u32::try_from(i).ok())
            .collect();
        let (mut nodes, mut bytes) = (0, 0);
        for top in tops {
            self.detach(top);
            let (n, b) = self.free_subtree(top, edges);
            nodes += n;
            bytes += b;
        }
        if nodes > 0 {
            self.compact();
        }
        (nodes, bytes)
    }

    /// Remove `node` from its parent's child list.
    fn detach(&mut self, node: u32) {
        let parent = self.nodes[node as usize].parent;
        if let Some(p) = self.nodes.get_mut(parent as usize) {
            p.children.retain(|&mut (_, c)| c != node);
        }
    }

    /// Free `top` and all its descendants (already detached), moving their
    /// edges to `edges`; returns (nodes, edge bytes) freed.
    fn free_subtree(&mut self, top: u32, edges: &mut Vec<Box<[u8]>>) -> (usize, usize) {
        let mut stack = vec![top];
        let (mut nodes, mut bytes) = (0, 0);
        while let Some(i) = stack.pop() {
            let node = std::mem::take(&mut self.nodes[i as usize]);
            let len = node.edge.len();
            for e in &node.backends {
                self.sub_usage(e.backend, len);
            }
            stack.extend(node.children.iter().map(|&(_, c)| c));
            edges.push(node.edge);
            self.nodes[i as usize].parent = FREE;
            nodes += 1;
            bytes += len;
        }
        self.live -= nodes;
        self.bytes -= bytes;
        (nodes, bytes)
    }

    /// Drop free slots at the end of the arena and rebuild the free list; when most slots
    /// are free, move the live nodes into a dense arena, so that the next eviction's passes
    /// over the arena cost what the tree holds, not what it once held.
    fn compact(&mut self) {
        while self.nodes.len() > 1 && self.nodes.last().is_some_and(|n| n.parent == FREE) {
            self.nodes.pop();
        }
        if self.nodes.len() > 2 * (self.live + 1) {
            return self.renumber();
        }
        self.free = (1..self.nodes.len())
            .filter(|&i| self.nodes[i].parent == FREE)
            .filter_map(|i| u32::try_from(i).ok())
            .collect();
    }

    /// Copy the live nodes, breadth first from the root, into a new arena without free slots.
    fn renumber(&mut self) {
        let mut old = std::mem::take(&mut self.nodes);
        let mut nodes = Vec::with_capacity(self.live + 1);
        nodes.push(std::mem::take(&mut old[ROOT as usize]));
        let mut at = 0;
        while at < nodes.len() {
            let children = std::mem::take(&mut nodes[at].children);
            for &(byte, child) in &children {
                let mut node = std::mem::take(&mut old[child as usize]);
                node.parent = at as u32;
                let index = nodes.len() as u32;
                nodes[at].children.push((byte, index));
                nodes.push(node);
            }
            at += 1;
        }
        self.nodes = nodes;
        self.free = Vec::new();
    }
}

#[cfg(test)]
mod tests {
    use super::cutoff;

    #[test]
    fn cutoff_frees_at_least_the_excess_oldest_first() {
        let ticks = vec![(5, 10), (1, 3), (3, 4), (3, 1)];
        assert_eq!(cutoff(ticks.clone(), 1), 1);
        assert_eq!(cutoff(ticks.clone(), 4), 3);
        assert_eq!(cutoff(ticks.clone(), 8), 3);
        assert_eq!(cutoff(ticks.clone(), 9), 5);
        assert_eq!(cutoff(ticks, 100), 5);
        assert_eq!(cutoff(Vec::new(), 1), 0);
    }
}
