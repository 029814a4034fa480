//! The work one hook run may spend on an image's files (issue 29, finding 3: 1,000 image links
//! to one crafted library cost 24-25 s of root CPU per start, and directories are the image's
//! choice, up to 100k entries each).
//!
//! A [`Budget`] is shared by everything one run reads of the image: the directories added to
//! the ld.so.cache and their libraries ([`crate::ldcache`]), the compat drop-ins and the compat
//! directory ([`crate::compat`]). When one of its bounds is spent the work stops where it is,
//! what was found so far is used, and a warning names the directory and the bound: the
//! container still starts, with fewer entries in its cache. Real images stay far below each
//! bound (a CUDA image's library directory has a few thousand entries, a few KB read from each
//! library); the bounds also keep the run well inside the hooks' timeout
//! ([`actk_core::cdi::generate::HOOK_TIMEOUT_S`]).

use rustix::time::{ClockId, clock_gettime};
use std::time::{Duration, Instant};

/// The bounds of a [`Budget`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetLimits {
    /// Directory entries looked at, over all directories of the run.
    pub entries: u64,
    /// Bytes read from the image's files (libraries, drop-ins), over the run.
    pub bytes: u64,
    /// CPU time of the calling thread spent since the budget was made.
    pub cpu: Duration,
    /// Time since the budget was made (covers waiting for I/O, which costs no CPU).
    pub wall: Duration,
}

impl Default for BudgetLimits {
    /// 100,000 entries, 64 MiB, 2 s of CPU, 10 s in all.
    fn default() -> Self {
        BudgetLimits { entries: 100_000, bytes: 64 << 20, cpu: Duration::from_secs(2), wall: Duration::from_secs(10) }
    }
}

/// What is left of the bounds of one hook run; see the module docs.
#[derive(Debug)]
pub struct Budget {
    limits: BudgetLimits,
    entries: u64,
    bytes: u64,
    cpu_start: Option<Duration>,
    started: Instant,
    spent: Option<Spent>,
}

/// Which bound of a [`Budget`] was spent (its `Display` says it with the bound's value).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Spent {
    /// [`BudgetLimits::entries`].
    Entries(u64),
    /// [`BudgetLimits::bytes`].
    Bytes(u64),
    /// [`BudgetLimits::cpu`].
    Cpu(Duration),
    /// [`BudgetLimits::wall`].
    Wall(Duration),
}

impl std::fmt::Display for Spent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Spent::Entries(n) => write!(f, "the budget of {n} directory entries per start is spent"),
            Spent::Bytes(n) => write!(f, "the budget of {n} bytes read per start is spent"),
            Spent::Cpu(d) => write!(f, "the budget of {} ms of CPU per start is spent", d.as_millis()),
            Spent::Wall(d) => write!(f, "the budget of {} ms per start is spent", d.as_millis()),
        }
    }
}

impl Default for Budget {
    fn default() -> Self {
        Budget::new(BudgetLimits::default())
    }
}

impl Budget {
    /// A budget with `limits`, starting now.
    pub fn new(limits: BudgetLimits) -> Budget {
        Budget { limits, entries: 0, bytes: 0, cpu_start: thread_cpu(), started: Instant::now(), spent: None }
    }

    /// Counts one directory entry, and checks the time. `Err` once any bound is spent (and from
    /// then on).
    pub fn entry(&mut self) -> Result<(), Spent> {
        self.entries += 1;
        if self.entries > self.limits.entries {
            self.spend(Spent::Entries(self.limits.entries))?;
        }
        self.check_time()
    }

    /// Bytes that may still be read.
    pub fn bytes_left(&self) -> u64 {
        if self.spent.is_some() { 0 } else { self.limits.bytes.saturating_sub(self.bytes) }
    }

    /// Counts `n` bytes read. `Err` once the bytes (or any bound) are spent.
    pub fn read(&mut self, n: u64) -> Result<(), Spent> {
        self.bytes = self.bytes.saturating_add(n);
        if self.bytes >= self.limits.bytes {
            self.spend(Spent::Bytes(self.limits.bytes))?;
        }
        self.spent.map_or(Ok(()), Err)
    }

    /// Marks the bytes as spent: a read the budget could not hold was refused.
    pub fn exhaust_bytes(&mut self) {
        let _ = self.spend(Spent::Bytes(self.limits.bytes));
    }

    /// `Err` when the CPU time or the time in all is spent (or another bound was).
    pub fn check_time(&mut self) -> Result<(), Spent> {
        if let Some(s) = self.spent {
            return Err(s);
        }
        if self.started.elapsed() > self.limits.wall {
            self.spend(Spent::Wall(self.limits.wall))?;
        }
        if let (Some(start), Some(now)) = (self.cpu_start, thread_cpu())
            && now.saturating_sub(start) > self.limits.cpu
        {
            self.spend(Spent::Cpu(self.limits.cpu))?;
        }
        Ok(())
    }

    /// What was spent, if anything.
    pub fn spent(&self) -> Option<Spent> {
        self.spent
    }

    fn spend(&mut self, s: Spent) -> Result<(), Spent> {
        Err(*self.spent.get_or_insert(s))
    }
}

/// Notes for the user about what a run skipped, one line each; past [`Notes::MAX`] lines only
/// their number is kept (a hostile image could earn one per directory entry).
#[derive(Debug, Default)]
pub struct Notes {
    lines: Vec<String>,
    more: usize,
}

impl Notes {
    /// Lines kept.
    pub const MAX: usize = 32;

    /// Adds a line.
    pub fn push(&mut self, line: String) {
        if self.lines.len() < Notes::MAX {
            self.lines.push(line);
        } else {
            self.more += 1;
        }
    }

    /// The lines joined by newlines, and how many more there were.
    pub fn finish(mut self) -> String {
        if self.more > 0 {
            self.lines.push(format!("({} more notes not shown)", self.more));
        }
        self.lines.join("\n")
    }
}

/// The calling thread's CPU time (`CLOCK_THREAD_CPUTIME_ID`): the hook's work is on one thread.
fn thread_cpu() -> Option<Duration> {
    let t = clock_gettime(ClockId::ThreadCPUTime);
    Some(Duration::new(u64::try_from(t.tv_sec).ok()?, u32::try_from(t.tv_nsec).ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_bound_stops_the_budget_and_says_which() {
        let mut b = Budget::new(BudgetLimits { entries: 2, ..BudgetLimits::default() });
        assert!(b.entry().is_ok() && b.entry().is_ok());
        assert_eq!(b.entry(), Err(Spent::Entries(2)));
        assert_eq!(b.read(1), Err(Spent::Entries(2)), "spent stays spent");
        assert_eq!(b.bytes_left(), 0);
        assert!(b.spent().unwrap().to_string().contains("2 directory entries"));

        let mut b = Budget::new(BudgetLimits { bytes: 100, ..BudgetLimits::default() });
        assert_eq!(b.bytes_left(), 100);
        assert!(b.read(60).is_ok());
        assert_eq!(b.bytes_left(), 40);
        assert_eq!(b.read(40), Err(Spent::Bytes(100)));

        let mut b = Budget::new(BudgetLimits { cpu: Duration::ZERO, ..BudgetLimits::default() });
        // Burn a little CPU so the thread's clock moves past zero.
        let mut x = 0u64;
        while thread_cpu().unwrap() <= b.cpu_start.unwrap() + Duration::from_micros(100) {
            x = x.wrapping_add(1);
        }
        assert!(x > 0);
        assert_eq!(b.entry(), Err(Spent::Cpu(Duration::ZERO)));

        let mut b = Budget::new(BudgetLimits { wall: Duration::ZERO, ..BudgetLimits::default() });
        std::thread::sleep(Duration::from_millis(1));
        assert_eq!(b.check_time(), Err(Spent::Wall(Duration::ZERO)));
    }
}
