//! Tests of the ring and tree search.

use super::*;

/// Parent links of one tree over `n` nodes: one root, at most two children each, and
/// every node reaches the root (no cycle). Returns each node's child count.
fn check_btree(t: &[Option<usize>], n: usize) -> Vec<usize> {
    assert_eq!(t.len(), n);
    let roots = t.iter().filter(|p| p.is_none()).count();
    assert_eq!(roots, usize::from(n > 0), "n={n}");
    let mut kids = vec![0; n];
    for (i, p) in t.iter().enumerate() {
        if let Some(p) = *p {
            assert!(p < n && p != i, "n={n}");
            kids[p] += 1;
        }
    }
    assert!(kids.iter().all(|&k| k <= 2), "n={n}: {kids:?}");
    for i in 0..n {
        let mut cur = i;
        let mut steps = 0;
        while let Some(p) = t[cur] {
            cur = p;
            steps += 1;
            assert!(steps <= n, "cycle at n={n}");
        }
    }
    kids
}

#[test]
fn double_btree_is_two_complementary_trees() {
    for n in 1..300 {
        let [t0, t1] = double_btree(n);
        let (k0, k1) = (check_btree(&t0, n), check_btree(&t1, n));
        for p in 0..n {
            assert!(
                k0[p] == 0 || k1[p] == 0,
                "n={n}: node {p} is interior in both trees ({} and {} children)",
                k0[p],
                k1[p]
            );
        }
        // About log2(n) deep: never deeper than the chain of doublings.
        assert!(
            dbt_depth(n) <= n.ilog2() as usize,
            "n={n}: {}",
            dbt_depth(n)
        );
    }
    assert_eq!([1, 2, 3, 4, 5, 8, 9].map(dbt_depth), [0, 1, 1, 2, 2, 3, 3]);
    // Two nodes: each is the other's root.
    assert_eq!(double_btree(2), [vec![Some(1), None], vec![None, Some(0)]]);
}

#[test]
fn dbt_channels_hang_chains_from_node_trees() {
    // Uneven nodes too: 3 + 1 + 2 ranks, not in rank order.
    for nodes in [
        vec![vec![0], vec![1], vec![2]],
        vec![vec![0, 1], vec![2, 3], vec![4, 5]],
        vec![vec![4, 0, 5], vec![2], vec![3, 1]],
        (0..5).map(|n| vec![n]).collect(),
    ] {
        let nranks: usize = nodes.iter().map(Vec::len).sum();
        let node_of = |r: usize| nodes.iter().position(|n| n.contains(&r)).unwrap();
        let trees = dbt_channels(&nodes, 4);
        for (c, t) in trees.iter().enumerate() {
            assert_eq!(t.which as usize, c % 2);
            assert_eq!(t.nodes.len(), nranks);
            let roots: Vec<usize> = (0..nranks).filter(|&r| t.nodes[r].up.is_none()).collect();
            assert_eq!(roots, vec![t.root], "{nodes:?} channel {c}");
            for (r, x) in t.nodes.iter().enumerate() {
                assert!(x.down.len() <= 3, "rank {r}: {:?}", x.down);
                for &d in &x.down {
                    assert_eq!(t.nodes[d].up, Some(r));
                }
                // Across nodes only between heads, and a node's head starts at its c-th rank.
                if let Some(u) = x.up.filter(|&u| node_of(u) != node_of(r)) {
                    let (a, b) = (&nodes[node_of(r)], &nodes[node_of(u)]);
                    assert_eq!((r, u), (a[c % a.len()], b[c % b.len()]));
                }
                // Every rank reaches the root.
                let (mut cur, mut steps) = (r, 0);
                while let Some(u) = t.nodes[cur].up {
                    cur = u;
                    steps += 1;
                    assert!(steps <= nranks);
                }
                assert_eq!(cur, t.root);
            }
            // The node-level tree is `double_btree`'s tree `c % 2`.
            let heads: Vec<usize> = nodes.iter().map(|n| n[c % n.len()]).collect();
            let want = &double_btree(nodes.len())[c % 2];
            for (i, &h) in heads.iter().enumerate() {
                assert_eq!(t.nodes[h].up.map(node_of), want[i], "{nodes:?} channel {c}");
            }
        }
    }
}
