//! Preferred allocation (kubelet `GetPreferredAllocation`) as pure functions over a device
//! topology: which `size` devices, among the available ones and including the must-include
//! ones, a container should get.
//!
//! The topology is read from the inventory's links (NVLink, NeuronLink, XGMI peers) and NUMA
//! nodes, and its shape is recognised from the link graph, not from the vendor name:
//! - [`Shape::Ring`]: every device has two peers and they form one cycle (Inferentia2 on
//!   inf2.48xlarge): a container gets a contiguous arc of the ring (F10);
//! - [`Shape::Torus`]: `side x side` devices numbered row-major, each linked to its four torus
//!   neighbours (Trainium on trn1.32xlarge, 4x4): only aligned blocks of 1, side, 2*side, ...
//!   devices (1, 4, 8, 16 on trn1) are connected rings; other sizes are placed in the smallest
//!   block that holds them, with a note saying why that is poor (F09);
//! - [`Shape::Links`]: anything else (NVLink or XGMI meshes, or no links): a greedy choice of the
//!   most interlinked set.
//!
//! In every shape the first criterion is NUMA: a set on one NUMA node beats a set spanning two.
//! Ties are broken towards leaving large free groups intact (best fit), then lowest indexes.

use std::collections::{BTreeMap, BTreeSet};

/// One device as the topology sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Node {
    /// Device index.
    pub index: u32,
    /// NUMA node, when known.
    pub numa: Option<u32>,
    /// Indexes of directly linked peers.
    pub links: Vec<u32>,
}

/// The recognised shape of a link graph.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Shape {
    /// One cycle through every device; the indexes in ring order starting at the lowest.
    Ring(Vec<u32>),
    /// A `side x side` 2D torus over indexes `0..side*side`, row-major.
    Torus {
        /// Devices per row.
        side: u32,
    },
    /// Any other graph (including no links at all).
    Links,
}

/// A preferred allocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Choice {
    /// Device indexes, ascending.
    pub devices: Vec<u32>,
    /// Why the choice is not a good placement, when it is not (logged by the plugin; an error
    /// with `strict_topology`).
    pub note: Option<String>,
}

/// A request that cannot be answered at all.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TopologyError {
    /// More devices asked for than are available.
    #[error("allocation size {size} exceeds the {available} available devices")]
    TooFewAvailable {
        /// Requested size.
        size: usize,
        /// Available count.
        available: usize,
    },
    /// More must-include devices than the allocation size.
    #[error("{must} must-include devices do not fit in an allocation of {size}")]
    MustExceedsSize {
        /// Must-include count.
        must: usize,
        /// Requested size.
        size: usize,
    },
    /// A must-include or available device is not a device of this node.
    #[error("device {0} is not a device of this node")]
    Unknown(u32),
    /// A must-include device is not among the available ones.
    #[error("must-include device {0} is not among the available devices")]
    MustNotAvailable(u32),
}

fn link_map(nodes: &[Node]) -> BTreeMap<u32, BTreeSet<u32>> {
    nodes.iter().map(|n| (n.index, n.links.iter().copied().filter(|l| *l != n.index).collect())).collect()
}

/// Recognise the shape of `nodes`' link graph (see the module docs).
pub fn shape(nodes: &[Node]) -> Shape {
    let links = link_map(nodes);
    if let Some(side) = torus_side(&links) {
        return Shape::Torus { side };
    }
    if let Some(order) = ring_order(&links) {
        return Shape::Ring(order);
    }
    Shape::Links
}

fn ring_order(links: &BTreeMap<u32, BTreeSet<u32>>) -> Option<Vec<u32>> {
    let n = links.len();
    if n < 3 || links.values().any(|l| l.len() != 2) {
        return None;
    }
    for (a, peers) in links {
        if peers.iter().any(|b| !links.get(b).is_some_and(|bp| bp.contains(a))) {
            return None;
        }
    }
    let start = *links.keys().next()?;
    let mut order = vec![start];
    let mut prev = start;
    let mut cur = *links[&start].iter().next()?; // towards the smaller neighbour first
    while cur != start {
        if order.len() >= n {
            return None;
        }
        order.push(cur);
        let next = *links[&cur].iter().find(|x| **x != prev)?;
        prev = cur;
        cur = next;
    }
    (order.len() == n).then_some(order)
}

fn torus_side(links: &BTreeMap<u32, BTreeSet<u32>>) -> Option<u32> {
    let n = u32::try_from(links.len()).ok()?;
    let side = (1..=n).find(|s| s * s >= n)?;
    if side < 3 || side * side != n || links.keys().copied().ne(0..n) {
        return None;
    }
    for (&i, peers) in links {
        let (r, c) = (i / side, i % side);
        let expected: BTreeSet<u32> = [
            r * side + (c + 1) % side,
            r * side + (c + side - 1) % side,
            ((r + 1) % side) * side + c,
            ((r + side - 1) % side) * side + c,
        ]
        .into_iter()
        .collect();
        if *peers != expected {
            return None;
        }
    }
    Some(side)
}

/// Valid block sizes of a `side x side` torus: 1, then side * 2^k dividing the device count.
pub fn torus_block_sizes(side: u32) -> Vec<u32> {
    let n = side * side;
    let mut sizes = vec![1];
    let mut b = side;
    while b < n {
        if n.is_multiple_of(b) {
            sizes.push(b);
        }
        b *= 2;
    }
    sizes.push(n);
    sizes
}

/// Number of distinct NUMA nodes in `set` (unknown counts as one node of its own).
fn numa_span(set: &[u32], numa: &BTreeMap<u32, Option<u32>>) -> usize {
    set.iter().map(|d| numa.get(d).copied().flatten()).collect::<BTreeSet<_>>().len()
}

fn list(set: &[u32]) -> String {
    set.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

/// A GetPreferredAllocation request after the checks both [`preferred`] and
/// [`preferred_cores`] make: either already answered (`must` fills `size`) or open.
enum Checked {
    Done(Choice),
    Open { avail: BTreeSet<u32>, must: BTreeSet<u32> },
}

/// The kubelet's request checked: every id known, `must` within `available`, and `size`
/// between `must.len()` and `available.len()`. Errors name the offending id or sizes.
fn check_request(
    known: impl Fn(u32) -> bool,
    available: &[u32],
    must: &[u32],
    size: usize,
) -> Result<Checked, TopologyError> {
    let avail: BTreeSet<u32> = available.iter().copied().collect();
    let must: BTreeSet<u32> = must.iter().copied().collect();
    if let Some(d) = avail.iter().chain(must.iter()).find(|d| !known(**d)) {
        return Err(TopologyError::Unknown(*d));
    }
    if let Some(d) = must.iter().find(|d| !avail.contains(d)) {
        return Err(TopologyError::MustNotAvailable(*d));
    }
    if must.len() > size {
        return Err(TopologyError::MustExceedsSize { must: must.len(), size });
    }
    if size > avail.len() {
        return Err(TopologyError::TooFewAvailable { size, available: avail.len() });
    }
    if size == must.len() {
        return Ok(Checked::Done(Choice { devices: must.into_iter().collect(), note: None }));
    }
    Ok(Checked::Open { avail, must })
}

/// The preferred `size` devices of `nodes` among `available`, including every `must` device.
///
/// Errors: an unknown device, a must-include device that is not available, more must-include
/// devices than `size`, or `size` above the available count. A poor but possible placement is
/// not an error: it comes with a [`Choice::note`].
pub fn preferred(nodes: &[Node], available: &[u32], must: &[u32], size: usize) -> Result<Choice, TopologyError> {
    let known: BTreeSet<u32> = nodes.iter().map(|n| n.index).collect();
    let (avail, must) = match check_request(|d| known.contains(&d), available, must, size)? {
        Checked::Done(choice) => return Ok(choice),
        Checked::Open { avail, must } => (avail, must),
    };
    let links = link_map(nodes);
    let numa: BTreeMap<u32, Option<u32>> = nodes.iter().map(|n| (n.index, n.numa)).collect();
    let ctx = Ctx { links: &links, numa: &numa, avail: &avail, must: &must, size };
    Ok(match shape(nodes) {
        Shape::Ring(order) => ring_choice(&ctx, &order),
        Shape::Torus { side } => torus_choice(&ctx, side),
        Shape::Links => Choice { devices: graph_choice(&ctx), note: None },
    })
}

struct Ctx<'a> {
    links: &'a BTreeMap<u32, BTreeSet<u32>>,
    numa: &'a BTreeMap<u32, Option<u32>>,
    avail: &'a BTreeSet<u32>,
    must: &'a BTreeSet<u32>,
    size: usize,
}

fn ring_choice(ctx: &Ctx<'_>, order: &[u32]) -> Choice {
    let n = order.len();
    let size = ctx.size;
    let mut best: Option<((usize, usize, usize), Vec<u32>)> = None;
    let starts = if size >= n { 1 } else { n };
    for start in 0..starts {
        let arc: Vec<u32> = (0..size).map(|k| order[(start + k) % n]).collect();
        if !arc.iter().all(|d| ctx.avail.contains(d)) || !ctx.must.iter().all(|m| arc.contains(m)) {
            continue;
        }
        // Best fit: an arc next to taken devices leaves the longer free runs whole.
        let free_edges = [order[(start + n - 1) % n], order[(start + size) % n]]
            .iter()
            .filter(|d| ctx.avail.contains(d) && !arc.contains(d))
            .count();
        let score = (numa_span(&arc, ctx.numa), free_edges, start);
        if best.as_ref().is_none_or(|(s, _)| score < *s) {
            best = Some((score, arc));
        }
    }
    match best {
        Some((_, mut arc)) => {
            arc.sort_unstable();
            Choice { devices: arc, note: None }
        }
        None => {
            let devices = graph_choice(ctx);
            let note = format!(
                "no {size} contiguous free devices on the device ring ({}); chose {}, which are not all neighbours, so collectives among them take extra hops",
                list(order),
                list(&devices)
            );
            Choice { devices, note: Some(note) }
        }
    }
}

/// The best fully available aligned block of `b` devices holding every must device.
fn best_block(ctx: &Ctx<'_>, n: u32, b: u32, sizes: &[u32]) -> Option<Vec<u32>> {
    let parent = sizes.iter().copied().find(|p| *p > b);
    let mut best: Option<((usize, usize, u32), Vec<u32>)> = None;
    for k in 0..n / b {
        let blk: Vec<u32> = (k * b..(k + 1) * b).collect();
        if !blk.iter().all(|d| ctx.avail.contains(d)) || !ctx.must.iter().all(|m| blk.contains(m)) {
            continue;
        }
        // Best fit: prefer the block whose enclosing larger block is already most used.
        let free_in_parent = parent.map_or(0, |p| {
            let lo = (k * b / p) * p;
            (lo..lo + p).filter(|d| !blk.contains(d) && ctx.avail.contains(d)).count()
        });
        let score = (numa_span(&blk, ctx.numa), free_in_parent, k);
        if best.as_ref().is_none_or(|(s, _)| score < *s) {
            best = Some((score, blk));
        }
    }
    best.map(|(_, b)| b)
}

fn torus_choice(ctx: &Ctx<'_>, side: u32) -> Choice {
    let n = side * side;
    let sizes = torus_block_sizes(side);
    let size = ctx.size;
    let valid = sizes.iter().map(u32::to_string).collect::<Vec<_>>().join(", ");
    let size_u32 = u32::try_from(size).unwrap_or(u32::MAX);
    if sizes.contains(&size_u32) {
        if let Some(block) = best_block(ctx, n, size_u32, &sizes) {
            return Choice { devices: block, note: None };
        }
        let devices = graph_choice(ctx);
        let note = format!(
            "no free aligned block of {size} devices on this {side}x{side} torus (blocks of {valid} devices are connected rings); chose {}, which is not a block",
            list(&devices)
        );
        return Choice { devices, note: Some(note) };
    }
    let lower = sizes.iter().copied().filter(|b| *b < size_u32).max().unwrap_or(1);
    let why = format!(
        "{size} devices cannot be placed well on this {side}x{side} torus of {n} devices: only blocks of {valid} devices are connected rings with full link bandwidth"
    );
    let bigger = sizes.iter().copied().find(|b| *b > size_u32);
    if let Some(b) = bigger
        && let Some(block) = best_block(ctx, n, b, &sizes)
    {
        let mut devices: Vec<u32> = ctx.must.iter().copied().collect();
        for d in &block {
            if devices.len() == size {
                break;
            }
            if !devices.contains(d) {
                devices.push(*d);
            }
        }
        devices.sort_unstable();
        let stranded = block.len() - size;
        let note = format!(
            "{why}; chose {} inside the {b}-device block {}-{}, leaving {stranded} device(s) of that block unusable as a block; ask for {b} or {lower} instead",
            list(&devices),
            block[0],
            block[block.len() - 1]
        );
        return Choice { devices, note: Some(note) };
    }
    let devices = graph_choice(ctx);
    let note = format!("{why}; no free block holds them either, so chose {}; ask for {lower} instead", list(&devices));
    Choice { devices, note: Some(note) }
}

/// Greedy: within each single NUMA node that can hold the request (and across all available
/// devices), grow a set from each seed by the device with most links into it; keep the set with
/// the fewest NUMA nodes, then most internal links, then lowest indexes.
fn graph_choice(ctx: &Ctx<'_>) -> Vec<u32> {
    let size = ctx.size;
    let mut scopes: Vec<Vec<u32>> = Vec::new();
    let numas: BTreeSet<Option<u32>> = ctx.avail.iter().map(|d| ctx.numa.get(d).copied().flatten()).collect();
    for nn in numas.iter().filter(|n| n.is_some()) {
        let scope: Vec<u32> = ctx.avail.iter().copied().filter(|d| ctx.numa.get(d).copied().flatten() == *nn).collect();
        if scope.len() >= size && ctx.must.iter().all(|m| scope.contains(m)) {
            scopes.push(scope);
        }
    }
    scopes.push(ctx.avail.iter().copied().collect());
    let any_links = ctx.avail.iter().any(|d| ctx.links.get(d).is_some_and(|l| l.iter().any(|p| ctx.avail.contains(p))));
    // (NUMA nodes spanned, more internal links first, indexes) and the set.
    type Scored = ((usize, std::cmp::Reverse<usize>, Vec<u32>), Vec<u32>);
    let mut best: Option<Scored> = None;
    for scope in &scopes {
        let seeds: Vec<Vec<u32>> = if !ctx.must.is_empty() {
            vec![ctx.must.iter().copied().collect()]
        } else if any_links {
            scope.iter().map(|d| vec![*d]).collect()
        } else {
            vec![Vec::new()] // no links: lowest indexes of the scope are as good as any
        };
        for seed in seeds {
            let set = grow(ctx, scope, seed);
            let mut sorted = set.clone();
            sorted.sort_unstable();
            let internal = internal_links(ctx, &sorted);
            let score = (numa_span(&sorted, ctx.numa), std::cmp::Reverse(internal), sorted.clone());
            if best.as_ref().is_none_or(|(s, _)| score < *s) {
                best = Some((score, sorted));
            }
        }
    }
    best.map(|(_, s)| s).unwrap_or_default()
}

fn grow(ctx: &Ctx<'_>, scope: &[u32], mut set: Vec<u32>) -> Vec<u32> {
    let mut into: BTreeMap<u32, usize> = scope.iter().map(|d| (*d, 0)).collect();
    let bump = |into: &mut BTreeMap<u32, usize>, d: u32| {
        for p in ctx.links.get(&d).into_iter().flatten() {
            if let Some(c) = into.get_mut(p) {
                *c += 1;
            }
        }
    };
    for d in &set {
        bump(&mut into, *d);
    }
    while set.len() < ctx.size {
        let pick = into
            .iter()
            .filter(|(d, _)| !set.contains(d))
            .max_by_key(|(d, c)| (**c, std::cmp::Reverse(**d)))
            .map(|(d, _)| *d);
        let Some(d) = pick else { break };
        set.push(d);
        bump(&mut into, d);
    }
    set
}

fn internal_links(ctx: &Ctx<'_>, set: &[u32]) -> usize {
    set.iter().map(|d| ctx.links.get(d).map_or(0, |l| l.iter().filter(|p| set.contains(p)).count())).sum::<usize>() / 2
}

/// Preferred cores of a per-core resource: `cores` maps each core to its device, `links` each
/// device to its linked peers. Chooses a run of consecutive cores (a NeuronCore group the
/// runtime can use as one, NEURON_RT_VISIBLE_CORES=a-b) on as few devices as possible whose
/// devices follow each other over links (contiguous within a device and across linked
/// devices), best fit, lowest first. Without such a run: a consecutive run over devices that
/// are not linked, with a note; then the must cores and the lowest free, with a note.
///
/// Errors as [`preferred`] (core numbers in place of device indexes).
pub fn preferred_cores(
    cores: &BTreeMap<u32, u32>,
    links: &BTreeMap<u32, Vec<u32>>,
    available: &[u32],
    must: &[u32],
    size: usize,
) -> Result<Choice, TopologyError> {
    let (avail, must) = match check_request(|c| cores.contains_key(&c), available, must, size)? {
        Checked::Done(choice) => return Ok(choice),
        Checked::Open { avail, must } => (avail, must),
    };
    let free_on = |dev: u32| cores.iter().filter(|(c, d)| **d == dev && avail.contains(c)).count();
    let any_links = links.values().any(|l| !l.is_empty());
    // Devices in the order a run visits them are each linked to the next.
    let linked_run =
        |devs: &[u32]| !any_links || devs.windows(2).all(|p| links.get(&p[0]).is_some_and(|l| l.contains(&p[1])));
    let all: Vec<u32> = cores.keys().copied().collect();
    // (not linked, devices spanned, free cores left on them, first core) and the run.
    type Scored = ((bool, usize, usize, u32), Vec<u32>);
    let mut best: Option<Scored> = None;
    for w in all.windows(size) {
        let consecutive = w.windows(2).all(|p| p[1] == p[0] + 1);
        if !consecutive || !w.iter().all(|c| avail.contains(c)) || !must.iter().all(|m| w.contains(m)) {
            continue;
        }
        let mut devs: Vec<u32> = w.iter().map(|c| cores[c]).collect();
        devs.dedup();
        let left: usize = devs.iter().map(|d| free_on(*d)).sum::<usize>() - size;
        let score = (!linked_run(&devs), devs.len(), left, w[0]);
        if best.as_ref().is_none_or(|(s, _)| score < *s) {
            best = Some((score, w.to_vec()));
        }
    }
    if let Some(((unlinked, ..), w)) = best {
        let note = unlinked.then(|| {
            let mut devs: Vec<u32> = w.iter().map(|c| cores[c]).collect();
            devs.dedup();
            format!(
                "cores {} span devices {} that are not linked to each other, so the group's traffic crosses the host",
                list(&w),
                list(&devs)
            )
        });
        return Ok(Choice { devices: w, note });
    }
    let mut out: Vec<u32> = must.iter().copied().collect();
    out.extend(avail.iter().copied().filter(|c| !must.contains(c)).take(size - must.len()));
    out.sort_unstable();
    Ok(Choice { note: Some(format!("no {size} consecutive free cores; chose cores {}", list(&out))), devices: out })
}

/// Preferred replicas of a time-sliced resource: `targets[p]` is what unit `p` gives (device,
/// MIG index). Spreads before stacking, as NVIDIA's "distributed" policy: each pick takes a
/// replica of the target this allocation has fewest of (a container asking for 2 gets 2
/// devices whenever 2 are offered: two replicas of one device are that device once), then of
/// the target with the fewest replicas held by others, then the lowest target; so four replicas
/// of an 8-GPU node land on four GPUs and a second pod lands on an idle GPU before sharing a
/// busy one.
///
/// Errors as [`preferred`] (unit positions in place of device indexes).
pub fn preferred_replicas(
    targets: &[(u32, Option<u32>)],
    available: &[u32],
    must: &[u32],
    size: usize,
) -> Result<Choice, TopologyError> {
    let (avail, must) = match check_request(|p| (p as usize) < targets.len(), available, must, size)? {
        Checked::Done(choice) => return Ok(choice),
        Checked::Open { avail, must } => (avail, must),
    };
    // Replicas held by others (not offered), and replicas of each target in this allocation.
    let mut in_use: BTreeMap<(u32, Option<u32>), usize> = BTreeMap::new();
    for (p, t) in targets.iter().enumerate() {
        let e = in_use.entry(*t).or_insert(0);
        if !avail.contains(&(p as u32)) {
            *e += 1;
        }
    }
    let mut mine: BTreeMap<(u32, Option<u32>), usize> = BTreeMap::new();
    let mut out: Vec<u32> = must.iter().copied().collect();
    for m in &must {
        *mine.entry(targets[*m as usize]).or_insert(0) += 1;
    }
    while out.len() < size {
        let pick = avail.iter().copied().filter(|p| !out.contains(p)).min_by_key(|p| {
            let t = targets[*p as usize];
            (mine.get(&t).copied().unwrap_or(0), in_use[&t], t, *p)
        });
        let Some(p) = pick else { break };
        *mine.entry(targets[p as usize]).or_insert(0) += 1;
        out.push(p);
    }
    out.sort_unstable();
    Ok(Choice { devices: out, note: None })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring(n: u32) -> Vec<Node> {
        (0..n).map(|i| Node { index: i, numa: Some(i * 2 / n), links: vec![(i + n - 1) % n, (i + 1) % n] }).collect()
    }

    #[test]
    fn shapes_are_recognised_from_links() {
        assert_eq!(shape(&ring(12)), Shape::Ring((0..12).collect()));
        let torus: Vec<Node> = (0..16)
            .map(|i| Node {
                index: i,
                numa: None,
                links: vec![(i + 12) % 16, i / 4 * 4 + (i + 3) % 4, (i + 4) % 16, i / 4 * 4 + (i + 1) % 4],
            })
            .collect();
        assert_eq!(shape(&torus), Shape::Torus { side: 4 });
        assert_eq!(torus_block_sizes(4), [1, 4, 8, 16]);
        let none: Vec<Node> = (0..4).map(|i| Node { index: i, numa: None, links: vec![] }).collect();
        assert_eq!(shape(&none), Shape::Links);
        // A broken ring (one missing way back) is not a ring.
        let mut r = ring(6);
        r[3].links = vec![2, 5];
        assert_ne!(shape(&r), Shape::Ring((0..6).collect()));
    }

    #[test]
    fn numa_local_first_without_links() {
        let nodes: Vec<Node> =
            (0..8).map(|i| Node { index: i, numa: Some(u32::from(i >= 4)), links: vec![] }).collect();
        // 0 and 1 taken: a pair fits on node 0 (2,3); four do not fit on node 0 any more.
        assert_eq!(preferred(&nodes, &[2, 3, 4, 5, 6, 7], &[], 2).unwrap().devices, [2, 3]);
        assert_eq!(preferred(&nodes, &[2, 3, 4, 5, 6, 7], &[], 4).unwrap().devices, [4, 5, 6, 7]);
        assert_eq!(preferred(&nodes, &[2, 3, 4, 5, 6, 7], &[3], 2).unwrap().devices, [2, 3]);
    }

    #[test]
    fn linked_sets_beat_index_order() {
        // Two NVLink islands {0,2,4,6} and {1,3,5,7} (full mesh each), one NUMA node.
        let nodes: Vec<Node> = (0..8)
            .map(|i| Node { index: i, numa: Some(0), links: (0..8).filter(|j| *j != i && j % 2 == i % 2).collect() })
            .collect();
        assert_eq!(preferred(&nodes, &(0..8).collect::<Vec<_>>(), &[], 4).unwrap().devices, [0, 2, 4, 6]);
        assert_eq!(preferred(&nodes, &(0..8).collect::<Vec<_>>(), &[1], 2).unwrap().devices, [1, 3]);
    }

    #[test]
    fn errors_name_the_problem() {
        let nodes = ring(4);
        assert_eq!(preferred(&nodes, &[0, 1], &[], 3), Err(TopologyError::TooFewAvailable { size: 3, available: 2 }));
        assert_eq!(preferred(&nodes, &[0, 1], &[2], 1), Err(TopologyError::MustNotAvailable(2)));
        assert_eq!(preferred(&nodes, &[0, 9], &[], 1), Err(TopologyError::Unknown(9)));
        assert_eq!(preferred(&nodes, &[0, 1, 2], &[0, 1], 1), Err(TopologyError::MustExceedsSize { must: 2, size: 1 }));
    }

    #[test]
    fn cores_stay_on_few_devices() {
        let cores: BTreeMap<u32, u32> = (0..8).map(|c| (c, c / 2)).collect();
        let none = BTreeMap::new();
        // Core 1 taken: a pair should be a whole device (2,3), not straddle 0 and 1.
        assert_eq!(preferred_cores(&cores, &none, &[0, 2, 3, 4, 5, 6, 7], &[], 2).unwrap().devices, [2, 3]);
        // Best fit: core 0 is alone on device 0, so one core comes from there.
        assert_eq!(preferred_cores(&cores, &none, &[0, 2, 3, 4, 5, 6, 7], &[], 1).unwrap().devices, [0]);
    }

    #[test]
    fn cores_across_devices_follow_links() {
        // 4 devices x 2 cores; links 0-1 and 2-3 only (two pairs). Cores 0 and 5 taken: a
        // 4-core group cannot be 1-4 (devices 0,1,2: 1 and 2 not linked) nor 2-5 (5 taken).
        let cores: BTreeMap<u32, u32> = (0..8).map(|c| (c, c / 2)).collect();
        let links: BTreeMap<u32, Vec<u32>> = [(0, vec![1]), (1, vec![0]), (2, vec![3]), (3, vec![2])].into();
        let avail = [1, 2, 3, 4, 6, 7];
        let c = preferred_cores(&cores, &links, &avail, &[], 3).unwrap();
        assert_eq!((c.devices.as_slice(), c.note.is_some()), (&[1, 2, 3][..], false), "devices 0-1 are linked");
        let c = preferred_cores(&cores, &links, &[2, 3, 4, 5], &[], 4).unwrap();
        assert_eq!(c.devices, [2, 3, 4, 5]);
        assert!(c.note.as_deref().unwrap().contains("not linked"), "{c:?}");
    }

    #[test]
    fn replicas_spread_before_stacking() {
        // 3 GPUs x 2 replicas: positions 0,1 -> GPU 0; 2,3 -> GPU 1; 4,5 -> GPU 2.
        let t: Vec<(u32, Option<u32>)> = (0..6).map(|p| (p / 2, None)).collect();
        let all: Vec<u32> = (0..6).collect();
        assert_eq!(preferred_replicas(&t, &all, &[], 3).unwrap().devices, [0, 2, 4], "one replica per GPU");
        // GPU 0 half used (position 0 taken): the next one goes to an idle GPU.
        assert_eq!(preferred_replicas(&t, &[1, 2, 3, 4, 5], &[], 1).unwrap().devices, [2]);
        // Only stacking is left.
        assert_eq!(preferred_replicas(&t, &[0, 1], &[], 2).unwrap().devices, [0, 1]);
        assert_eq!(preferred_replicas(&t, &all, &[0], 2).unwrap().devices, [0, 2], "must, then spread");
        assert!(preferred_replicas(&t, &[0, 9], &[], 1).is_err());
        // Issue 28 item 9: 2 GPUs x 4 replicas, GPU 0 has 2 replicas held and GPU 1 has 3: two
        // replicas for one container are one of each GPU, not both free replicas of the less
        // busy GPU 0 (which the container would see as one GPU).
        let t: Vec<(u32, Option<u32>)> = (0..8).map(|p| (p / 4, None)).collect();
        assert_eq!(preferred_replicas(&t, &[1, 2, 7], &[], 2).unwrap().devices, [1, 7]);
        // Three replicas over two GPUs: both GPUs, then the less busy one again.
        assert_eq!(preferred_replicas(&t, &[1, 2, 6, 7], &[], 3).unwrap().devices, [1, 2, 6]);
        // A must-include replica counts as this allocation's: the next one is the other GPU.
        assert_eq!(preferred_replicas(&t, &[1, 2, 7], &[2], 2).unwrap().devices, [2, 7]);
    }
}
