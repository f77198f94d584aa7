//! lab-impaird: a userspace equivalent of Linux sch_netem that forwards Ethernet frames between
//! two interfaces (AF_PACKET + PACKET_VNET_HDR) and impairs each direction independently.
//!
//! Layout: `rng`/`dist` (random numbers, netem distribution tables), `model` (the JSON spec and the
//! netem decision logic, pure and unit-tested), `csum` (checksum completion, corruption, software
//! GSO), `pkt` (AF_PACKET sockets and batched I/O), `trace` (trace-driven links, Mahimahi's format), `fwd` (one
//! forwarding loop per direction with its timer heap), `control` (the Unix control socket).

pub mod control;
pub mod csum;
pub mod dist;
pub mod fwd;
pub mod model;
pub mod pkt;
pub mod rng;
pub mod trace;

/// CLOCK_MONOTONIC in nanoseconds (vDSO, no syscall).
#[inline]
pub fn now_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

#[inline]
pub fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
