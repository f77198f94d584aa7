//! lab-impaird --a IFACE --b IFACE --control SOCK [--config FILE.json] [--cpu N]
//!
//! Forwards every frame between interfaces a and b of the current network namespace, applying
//! the a2b and b2a impairment specs, and serves the control socket. Prints only errors (stderr).

use impair::control::{self, Engine};
use impair::fwd::{DirShared, Forwarder};
use impair::pkt::PacketSocket;
use serde_json::Value;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

const USAGE: &str = "usage: lab-impaird --a IFACE --b IFACE --control SOCKET [--config FILE.json] [--cpu N] [--rt-prio N (0 = off, default 10)] [--spin-us N (default 20)]";

struct Args {
    a: String,
    b: String,
    control: String,
    config: Option<String>,
    cpu: Option<usize>,
    rt_prio: i32,
    spin_us: u64,
}

fn parse_args() -> Result<Args, String> {
    let mut it = std::env::args().skip(1);
    let (mut a, mut b, mut control, mut config, mut cpu) = (None, None, None, None, None);
    let mut rt_prio = 10;
    let mut spin_us = 20;
    while let Some(arg) = it.next() {
        let mut val = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value\n{USAGE}"));
        match arg.as_str() {
            "--a" => a = Some(val("--a")?),
            "--b" => b = Some(val("--b")?),
            "--control" => control = Some(val("--control")?),
            "--config" => config = Some(val("--config")?),
            "--cpu" => cpu = Some(val("--cpu")?.parse().map_err(|_| "--cpu: expected a CPU number".to_string())?),
            "--rt-prio" => {
                rt_prio = val("--rt-prio")?.parse().map_err(|_| "--rt-prio: expected 0..99".to_string())?;
                if !(0..=99).contains(&rt_prio) {
                    return Err("--rt-prio: expected 0..99".into());
                }
            }
            "--spin-us" => {
                spin_us = val("--spin-us")?.parse().map_err(|_| "--spin-us: expected microseconds".to_string())?;
            }
            "--version" => {
                eprintln!("lab-impaird {}", control::VERSION);
                std::process::exit(0);
            }
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    Ok(Args {
        a: a.ok_or(format!("--a is required\n{USAGE}"))?,
        b: b.ok_or(format!("--b is required\n{USAGE}"))?,
        control: control.ok_or(format!("--control is required\n{USAGE}"))?,
        config,
        cpu,
        rt_prio,
        spin_us,
    })
}

/// --config file: {"a2b": spec, "b2a": spec} (either optional).
fn load_config(engine: &Engine, path: &str) -> Result<(), String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    let v: Value = serde_json::from_str(&text).map_err(|e| format!("{path}: bad JSON: {e}"))?;
    let m = v.as_object().ok_or(format!("{path}: expected an object with a2b/b2a"))?;
    for (k, spec) in m {
        match k.as_str() {
            "a2b" | "b2a" => engine.set(k, spec).map_err(|e| format!("{path}: {k}: {e}"))?,
            _ => return Err(format!("{path}: unknown key {k:?}; accepted: a2b, b2a")),
        }
    }
    Ok(())
}

fn pin_cpu(cpu: usize) -> Result<(), String> {
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            return Err(format!("--cpu {cpu}: {}", std::io::Error::last_os_error()));
        }
    }
    Ok(())
}

fn run() -> Result<(), String> {
    let args = parse_args()?;
    let rt_prio = args.rt_prio;
    if let Some(c) = args.cpu {
        pin_cpu(c)?;
    }
    // Block the stop signals in every thread; the main thread waits for them with sigwait().
    let mut sigs: libc::sigset_t = unsafe { std::mem::zeroed() };
    unsafe {
        libc::sigemptyset(&mut sigs);
        libc::sigaddset(&mut sigs, libc::SIGTERM);
        libc::sigaddset(&mut sigs, libc::SIGINT);
        libc::sigaddset(&mut sigs, libc::SIGHUP);
        libc::pthread_sigmask(libc::SIG_BLOCK, &sigs, std::ptr::null_mut());
    }
    let a = Arc::new(PacketSocket::open(&args.a)?);
    let b = Arc::new(PacketSocket::open(&args.b)?);
    let engine = Arc::new(Engine {
        a2b: Arc::new(DirShared::new("a2b", 0, a.clone(), b.clone())),
        b2a: Arc::new(DirShared::new("b2a", 0x9E37_79B9_7F4A_7C15, b.clone(), a.clone())),
    });
    if let Some(path) = &args.config {
        load_config(&engine, path)?;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::new();
    for d in [engine.a2b.clone(), engine.b2a.clone()] {
        let fwd = Forwarder::new(d.clone(), stop.clone(), args.spin_us * 1000, rt_prio);
        workers.push(
            std::thread::Builder::new()
                .name(format!("fwd-{}", d.name))
                .spawn(move || fwd.run())
                .map_err(|e| format!("cannot start thread: {e}"))?,
        );
    }
    // Bound last: a successful ping means both interfaces are open and forwarding.
    let listener = control::bind(&args.control)?;
    {
        let e = engine.clone();
        std::thread::Builder::new()
            .name("control".into())
            .spawn(move || control::serve(listener, e))
            .map_err(|e| format!("cannot start thread: {e}"))?;
    }
    let mut sig: libc::c_int = 0;
    unsafe { libc::sigwait(&sigs, &mut sig) };
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        let _ = w.join();
    }
    let _ = std::fs::remove_file(&args.control);
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lab-impaird: {e}");
            ExitCode::from(2)
        }
    }
}
