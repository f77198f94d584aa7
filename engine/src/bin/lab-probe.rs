//! lab-probe: a UDP sequence/timestamp probe for measuring what the engine does to packets.
//!
//!   lab-probe send --to IP:PORT --count N --rate PPS [--size BYTES]
//!   lab-probe recv --bind IP:PORT --out FILE [--timeout S] [--idle-ms MS]
//!
//! Each datagram carries (seq u64, send time u64 ns CLOCK_REALTIME). The receiver takes the
//! kernel's receive timestamp (SO_TIMESTAMPNS, same clock) so one-way delay on one machine is
//! exact up to the kernel path, and writes one little-endian record per datagram received:
//! (seq u64, sent_ns u64, received_ns u64). It prints a JSON summary on stdout.

use std::mem::{size_of, zeroed};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::process::ExitCode;
use std::time::{Duration, Instant};

fn realtime_ns() -> u64 {
    impair::clock_ns(libc::CLOCK_REALTIME)
}

fn opt(args: &[String], name: &str) -> Option<String> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1).cloned())
}

fn need<T: std::str::FromStr>(args: &[String], name: &str, default: Option<T>) -> Result<T, String> {
    match opt(args, name) {
        Some(v) => v.parse().map_err(|_| format!("{name}: bad value {v:?}")),
        None => default.ok_or(format!("{name} is required")),
    }
}

/// Sleep until `target_mono` with clock_nanosleep (timer slack 1 ns); the send time stamped in
/// the datagram is taken after waking, so pacing jitter does not affect the delay measured.
fn sleep_until_ns(target_mono: u64) {
    if impair::now_ns() >= target_mono {
        return;
    }
    let ts = libc::timespec { tv_sec: (target_mono / 1_000_000_000) as i64, tv_nsec: (target_mono % 1_000_000_000) as i64 };
    unsafe { libc::clock_nanosleep(libc::CLOCK_MONOTONIC, libc::TIMER_ABSTIME, &ts, std::ptr::null_mut()) };
}

fn send(args: &[String]) -> Result<(), String> {
    let to: SocketAddr = need(args, "--to", None)?;
    let count: u64 = need(args, "--count", None)?;
    let rate: f64 = need(args, "--rate", Some(1000.0))?;
    let size: usize = need(args, "--size", Some(64))?;
    let size = size.max(16);
    let bind = if to.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" };
    let sock = UdpSocket::bind(bind).map_err(|e| format!("bind: {e}"))?;
    sock.connect(to).map_err(|e| format!("connect {to}: {e}"))?;
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1, 0, 0, 0) };
    let mut buf = vec![0u8; size];
    let interval = 1e9 / rate;
    let t0 = impair::now_ns() + 1_000_000;
    let mut errors = 0u64;
    for seq in 0..count {
        sleep_until_ns(t0 + (seq as f64 * interval) as u64);
        buf[..8].copy_from_slice(&seq.to_le_bytes());
        buf[8..16].copy_from_slice(&realtime_ns().to_le_bytes());
        if sock.send(&buf).is_err() {
            errors += 1;
        }
    }
    println!("{{\"sent\": {count}, \"send_errors\": {errors}}}");
    Ok(())
}

fn recv(args: &[String]) -> Result<(), String> {
    let bind: SocketAddr = need(args, "--bind", None)?;
    let out: String = need(args, "--out", None)?;
    let timeout: f64 = need(args, "--timeout", Some(60.0))?;
    let idle_ms: u64 = need(args, "--idle-ms", Some(1000))?;
    let sock = UdpSocket::bind(bind).map_err(|e| format!("bind {bind}: {e}"))?;
    let fd = sock.as_raw_fd();
    let one: libc::c_int = 1;
    let big: libc::c_int = 16 << 20;
    unsafe {
        libc::setsockopt(fd, libc::SOL_SOCKET, libc::SO_TIMESTAMPNS, &one as *const _ as *const libc::c_void, 4);
        libc::setsockopt(fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, &big as *const _ as *const libc::c_void, 4);
    }
    sock.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    // Signal readiness on stdout-independent channel: a file next to the output.
    let ready = format!("{out}.ready");
    std::fs::write(&ready, b"").map_err(|e| format!("{ready}: {e}"))?;
    let start = Instant::now();
    let mut last: Option<Instant> = None;
    let mut recs: Vec<u8> = Vec::with_capacity(1 << 20);
    let mut buf = vec![0u8; 65536];
    let mut cbuf = [0u8; 256];
    let mut n_recv = 0u64;
    loop {
        if start.elapsed().as_secs_f64() > timeout {
            break;
        }
        if let Some(l) = last {
            if l.elapsed() > Duration::from_millis(idle_ms) {
                break;
            }
        }
        let mut iov = libc::iovec { iov_base: buf.as_mut_ptr() as *mut libc::c_void, iov_len: buf.len() };
        let mut msg: libc::msghdr = unsafe { zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr() as *mut libc::c_void;
        msg.msg_controllen = cbuf.len();
        let n = unsafe { libc::recvmsg(fd, &mut msg, 0) };
        if n < 16 {
            continue;
        }
        let mut rx_ns = 0u64;
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_TIMESTAMPNS {
                    let ts: libc::timespec = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::timespec);
                    rx_ns = ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64;
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
        }
        if rx_ns == 0 {
            rx_ns = realtime_ns();
        }
        recs.extend_from_slice(&buf[..16]);
        recs.extend_from_slice(&rx_ns.to_le_bytes());
        n_recv += 1;
        last = Some(Instant::now());
    }
    let _ = size_of::<u64>();
    let tmp = format!("{out}.tmp");
    std::fs::write(&tmp, &recs).map_err(|e| format!("{tmp}: {e}"))?;
    std::fs::rename(&tmp, &out).map_err(|e| format!("{out}: {e}"))?;
    let _ = std::fs::remove_file(&ready);
    println!("{{\"received\": {n_recv}}}");
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let r = match args.first().map(String::as_str) {
        Some("send") => send(&args),
        Some("recv") => recv(&args),
        _ => Err("usage: lab-probe send --to IP:PORT --count N --rate PPS [--size B] | recv --bind IP:PORT --out FILE [--timeout S] [--idle-ms MS]".into()),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lab-probe: {e}");
            ExitCode::from(2)
        }
    }
}
