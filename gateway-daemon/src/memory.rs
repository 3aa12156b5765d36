//! Returning freed memory to the system, and the pages the heap is made of. The
//! `berth` binary allocates with mimalloc, which keeps freed pages for reuse: after a
//! plan of 10k routes they are megabytes the daemon no longer uses.
//!
//! A start reads and plans everything at once, touching hundreds of megabytes for the
//! first time; in huge pages (mimalloc asks for them), each first touch zeroes 2 MiB.
//! At 100,000 routes the start took 5.6 s with huge pages and 4.3 s without; but the
//! cycles after it were 17 % slower in small pages (TLB misses over a 600 MiB heap,
//! bench control-plane, same run). So the start runs in small pages, and once the first
//! plan is published the heap is collapsed into huge pages in the background.

/// Returns the pages freed on this thread (and abandoned by finished threads) to the
/// operating system.
pub fn release_freed() {
    crate::sys::alloc::collect();
}

/// How long memory freed after the start stays for reuse before it is given back.
///
/// A change after the start frees what it allocated, and the next change allocates
/// about as much again. Given back soon (mimalloc's default is after a second, and a
/// forced collect followed every plan), each change faulted its pages in anew, and
/// give-backs split the heap's collapsed huge pages. Kept for a minute, they cost a few
/// megabytes while changes come, and are given back when they stop. Measured at
/// 100,000 routes (bench control-plane, three runs each, alternated with a collect
/// per plan): new route p50 9.6-14.8 ms against 9.8-12.0, the first change after 10 s
/// idle 108-175 against 121-187, RSS at ready and peak the same; within this VM's
/// noise, for a forced collect less per plan. Never giving back (`-1`) made the first
/// change 87-104 ms but held 50 MiB more from the start on.
const KEEP_FREED_MS: i64 = 60_000;

/// Before the first plan: new memory in small pages, and memory freed given back at
/// once (unless the operator chose, `MIMALLOC_PURGE_DELAY`). What a start frees (the
/// files' text, each stage's scratch) is not allocated again, and kept for mimalloc's
/// default second it was still resident when the first plan's index was built on a
/// second thread while the datapath was written, whose heap cannot reuse it: peak
/// 507-515 MiB at 100,000 routes, 489 given back at once (bench control-plane, same
/// window, cold start unchanged).
pub fn starting() {
    if let Err(e) = crate::sys::alloc::huge_pages(false) {
        tracing::debug!(error = %e, "transparent huge pages stay as they are");
    }
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        crate::sys::alloc::set_purge_delay(0);
    }
}

/// After a plan is published. The first: what the start freed (hundreds of megabytes
/// at 100,000 routes) is given back, memory freed from now on is kept for reuse
/// (`KEEP_FREED_MS`), huge pages are allowed again, and the heap is made of them (a
/// background thread at the lowest priority; huge pages are a speed-up, so a kernel
/// that cannot is left alone).
pub fn published() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        release_freed();
        // Only where the operator did not choose (`MIMALLOC_PURGE_DELAY`).
        if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
            crate::sys::alloc::set_purge_delay(KEEP_FREED_MS);
        }
        tracing::debug!(
            purge_delay_ms = crate::sys::alloc::purge_delay(),
            "memory freed from now on is kept for reuse this long before it is given back"
        );
        if crate::sys::alloc::huge_pages(true).is_err() {
            return;
        }
        let spawned = std::thread::Builder::new()
            .name("collapse".into())
            .spawn(collapse_heap);
        if let Err(e) = spawned {
            tracing::debug!(error = %e, "the heap stays in small pages");
        }
    });
}

/// Collapses the process's anonymous read-write mappings into huge pages.
fn collapse_heap() {
    crate::sys::sched::lowest_priority();
    let started = std::time::Instant::now();
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return;
    };
    let pagemap = std::fs::File::open("/proc/self/pagemap").ok();
    let mut collapsed = 0usize;
    for line in maps.lines() {
        // `start-end perms offset dev inode [path]`: anonymous ones have no path.
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.len() != 5 || !fields[1].starts_with("rw") {
            continue;
        }
        let Some((a, b)) = fields[0].split_once('-') else {
            continue;
        };
        let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) else {
            continue;
        };
        let (start, end) = (a.next_multiple_of(HUGE), b / HUGE * HUGE);
        // Huge page by huge page (a range with one never touched fails as a whole), and
        // only where nearly every small page is in use: a collapse fills the rest.
        for at in (start..end).step_by(HUGE) {
            let used = pagemap
                .as_ref()
                .and_then(|f| present_pages(f, at, HUGE / PAGE).ok())
                .unwrap_or(0);
            if used >= HUGE / PAGE * 15 / 16 && crate::sys::alloc::collapse(at, HUGE).is_ok() {
                collapsed += HUGE;
            }
        }
    }
    // From now on new memory comes in small pages again: a huge page fault may stall
    // on compaction (`defrag` is `madvise` by default, and mimalloc asks for them),
    // and it did: 33 ms in the first change after a start at 10,000 routes, where a
    // change takes 5. What was collapsed stays in huge pages.
    let _ = crate::sys::alloc::huge_pages(false);
    tracing::debug!(
        mib = collapsed >> 20,
        took = ?started.elapsed(),
        "heap collapsed into huge pages"
    );
}

const HUGE: usize = 2 << 20;
const PAGE: usize = 4096;

/// How many of the `count` small pages from `start` are in memory (bit 63 of their
/// `/proc/self/pagemap` entries).
fn present_pages(pagemap: &std::fs::File, start: usize, count: usize) -> std::io::Result<usize> {
    use std::os::unix::fs::FileExt as _;
    let mut entries = vec![0u8; count * 8];
    pagemap.read_exact_at(&mut entries, (start / PAGE * 8) as u64)?;
    Ok(entries.chunks_exact(8).filter(|e| e[7] & 0x80 != 0).count())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_written_are_counted_present() {
        let mut buf = vec![0u8; 3 * HUGE];
        buf.iter_mut().step_by(PAGE).for_each(|b| *b = 1);
        let start = (buf.as_ptr() as usize).next_multiple_of(HUGE);
        let pagemap = std::fs::File::open("/proc/self/pagemap").expect("pagemap");
        let present = present_pages(&pagemap, start, HUGE / PAGE).expect("read");
        assert_eq!(present, HUGE / PAGE, "every page of the chunk was written");
        std::hint::black_box(&buf);
    }
}
