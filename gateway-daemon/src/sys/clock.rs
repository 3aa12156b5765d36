//! Clocks the kernel's BPF helpers read, which `std::time` does not offer.

/// `CLOCK_MONOTONIC_COARSE` in nanoseconds (the clock of `bpf_ktime_get_coarse_ns`);
/// 0 if the clock cannot be read.
pub(crate) fn monotonic_coarse_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC_COARSE)
}

/// `CLOCK_MONOTONIC` in nanoseconds (the clock of `bpf_ktime_get_ns`); 0 if the clock
/// cannot be read.
pub(crate) fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec that lives through the call; clock_gettime only
    // writes into it.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    (ts.tv_sec as u64) * 1_000_000_000 + ts.tv_nsec as u64
}
