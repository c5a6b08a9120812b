//! The trees: NCCL's double binary tree over nodes, and the trees of chains (a chain of the
//! GPUs of each node, the chains joined by a tree) that the communicator wires per channel.

use super::*;

/// The parent of label `i` (1..=n) in the binary tree over labels `1..=n` numbered in order
/// (NCCL's construction, without its extra root 0 on top): a label's lowest set bit gives its
/// height, so odd labels are leaves and every interior label is even; the root is the largest
/// power of two not above `n`. A label whose parent would lie past `n` hangs from the next
/// label above in its line (`i` less its lowest bit), which that missing label would have
/// hung from, so no label gets a third child.
pub fn btree_parent(n: usize, i: usize) -> Option<usize> {
    if i == 0 || i > n {
        return None;
    }
    let bit = i & i.wrapping_neg();
    let up = (i ^ bit) | (bit << 1);
    if up <= n {
        return Some(up);
    }
    let above = i ^ bit;
    (above != 0).then_some(above)
}

/// The two trees of the double binary tree over `n` nodes (NCCL's, as its paper and blog
/// describe it): the parent of every node `0..n` in tree 0 and in tree 1. Node `p` is label
/// `p + 1` of [`btree_parent`]'s tree in tree 0; tree 1 is tree 0 with its labels mirrored
/// (`n + 1 - l`, `n` even) or shifted by one (`l % n + 1`, `n` odd). Either way tree 0's
/// interior labels (even) become odd ones, the leaves of tree 0: every node is interior in at
/// most one of the two trees, so each node's links carry about the same load in both, and
/// each tree is about log2(n) deep.
pub fn double_btree(n: usize) -> [Vec<Option<usize>>; 2] {
    let t0: Vec<Option<usize>> = (1..=n).map(|l| btree_parent(n, l).map(|u| u - 1)).collect();
    // Position p of tree 0 holds node map(p) in tree 1.
    let map = |p: usize| {
        if n.is_multiple_of(2) {
            n - 1 - p
        } else {
            (p + 1) % n
        }
    };
    let mut t1 = vec![None; n];
    for p in 0..n {
        t1[map(p)] = t0[p].map(map);
    }
    [t0, t1]
}

/// Edges from the deepest node of either tree of [`double_btree`]`(n)` to its root: the
/// tree's hops across nodes, each way.
pub fn dbt_depth(n: usize) -> usize {
    double_btree(n)
        .iter()
        .map(|t| {
            (0..n)
                .map(|mut p| {
                    let mut d = 0;
                    while let Some(u) = t[p] {
                        p = u;
                        d += 1;
                        if d > n {
                            break; // not a tree: never (the unit tests check it)
                        }
                    }
                    d
                })
                .max()
                .unwrap_or(0)
        })
        .max()
        .unwrap_or(0)
}

/// A tree over ranks: each node's chain (`chains[node]`, its ranks head first; empty nodes
/// are skipped) hangs from its parent node's head in tree `which` of [`double_btree`] over
/// the nodes. A head's children are the next rank of its chain first, then the heads of its
/// child nodes. Every rank in `0..nranks` must be in exactly one chain.
pub fn tree_of_chains(chains: &[Vec<usize>], nranks: usize, which: u8) -> Tree {
    let chains: Vec<&Vec<usize>> = chains.iter().filter(|c| !c.is_empty()).collect();
    let parents = &double_btree(chains.len())[which as usize & 1];
    let mut nodes = vec![TreeNode::default(); nranks];
    let mut root = chains.first().map_or(0, |c| c[0]);
    for chain in &chains {
        for w in chain.windows(2) {
            nodes[w[1]].up = Some(w[0]);
            nodes[w[0]].down.push(w[1]);
        }
    }
    for (node, chain) in chains.iter().enumerate() {
        match parents[node] {
            Some(p) => {
                let (h, ph) = (chain[0], chains[p][0]);
                nodes[h].up = Some(ph);
                nodes[ph].down.push(h);
            }
            None => root = chain[0],
        }
    }
    Tree { root, nodes, which }
}

/// Per channel, the tree AllReduce runs on across nodes (`nodes[n]`: node n's ranks in their
/// order): channel `c` uses tree `c % 2` of the double binary tree over the nodes, so
/// successive channels split between the two trees, and each node's chain starts at its
/// `c`-th rank (as ring `c` enters the node there: `comm::rings::across_nodes`), so successive
/// channels cross the network from different GPUs.
pub fn dbt_channels(nodes: &[Vec<usize>], nchannels: usize) -> Vec<Tree> {
    let nranks = nodes.iter().map(Vec::len).sum();
    (0..nchannels)
        .map(|c| {
            let chains: Vec<Vec<usize>> = nodes
                .iter()
                .map(|node| {
                    let n = node.len().max(1);
                    (0..node.len()).map(|i| node[(i + c) % n]).collect()
                })
                .collect();
            tree_of_chains(&chains, nranks, (c % 2) as u8)
        })
        .collect()
}

/// Logs `rank`'s place in every channel's tree as NCCL does:
/// `Trees [0] 1/-1/-1->0->-1 [1] ...` (children, the rank, its parent; -1: none).
pub fn log_trees(rank: usize, trees: &[Tree]) {
    let mut line = String::new();
    for (c, t) in trees.iter().enumerate() {
        let node = &t.nodes[rank];
        let d = |i: usize| node.down.get(i).map_or(-1, |x| *x as i64);
        line.push_str(&format!(
            " [{c}] {}/{}/{}->{rank}->{}",
            d(0),
            d(1),
            d(2),
            node.up.map_or(-1, |x| x as i64)
        ));
    }
    log::info!(target: crate::debug::INIT, "Trees{line}");
}

pub(super) fn build_tree(ranks: &[Vec<usize>], order: &[usize], which: u8) -> Tree {
    let nranks = ranks.len() * order.len();
    let chains: Vec<Vec<usize>> = ranks
        .iter()
        .map(|r| order.iter().map(|&g| r[g]).collect())
        .collect();
    tree_of_chains(&chains, nranks, which)
}
