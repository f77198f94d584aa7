//! One forwarding loop per direction: receive a batch from the ingress interface, apply the
//! netem decisions, and send frames out of the egress interface at their time.
//!
//! Fast path: with no impairment (and nothing queued) a received batch is re-sent as is from the
//! receive buffers. Otherwise frames are copied into right-sized buffers and kept in a timer heap
//! ordered by (time to send, arrival); the loop sleeps on ppoll() with a timerfd armed slightly
//! before the next deadline (timer slack set to 1 ns) and spins for the last few microseconds.

use crate::csum::{self, VnetHdr, VNET_HDR_LEN};
use crate::model::{Netem, Sched};
use crate::now_ns;
use crate::trace::TraceLink;
use crate::pkt::{forward_rx, PacketSocket, RxBatch, TxBatch};
use serde_json::{json, Value};
use std::cmp::Ordering as CmpOrdering;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

const R: Ordering = Ordering::Relaxed;

#[derive(Default)]
pub struct Counters {
    pub seen: AtomicU64,
    pub forwarded: AtomicU64,
    pub dropped_loss: AtomicU64,
    pub dropped_limit: AtomicU64,
    pub duplicated: AtomicU64,
    pub reordered: AtomicU64,
    pub corrupted: AtomicU64,
    pub queue_depth: AtomicU64,
    pub queue_depth_max: AtomicU64,
    pub bytes: AtomicU64,
    /// Frames the kernel dropped because the engine's receive buffer was full.
    pub dropped_rx: AtomicU64,
    /// Frames the egress interface refused (EMSGSIZE, ENETDOWN...).
    pub tx_errors: AtomicU64,
    /// Frames larger than the receive buffer (cannot happen below 64 KiB GSO frames).
    pub truncated: AtomicU64,
    /// GSO super-frames split into wire packets before the model saw them, and how many wire
    /// packets they became (every per-packet decision counts wire packets, see `run`).
    pub gso_frames: AtomicU64,
    pub gso_segments: AtomicU64,
    /// GSO super-frames of a type the engine cannot split (passed whole to the model).
    pub gso_unsplit: AtomicU64,
}

impl Counters {
    pub fn to_json(&self) -> Value {
        json!({
            "seen": self.seen.load(R),
            "forwarded": self.forwarded.load(R),
            "dropped_loss": self.dropped_loss.load(R),
            "dropped_limit": self.dropped_limit.load(R),
            "duplicated": self.duplicated.load(R),
            "reordered": self.reordered.load(R),
            "corrupted": self.corrupted.load(R),
            "queue_depth": self.queue_depth.load(R),
            "queue_depth_max": self.queue_depth_max.load(R),
            "bytes": self.bytes.load(R),
            "dropped_rx": self.dropped_rx.load(R),
            "tx_errors": self.tx_errors.load(R),
            "truncated": self.truncated.load(R),
            "gso_frames": self.gso_frames.load(R),
            "gso_segments": self.gso_segments.load(R),
            "gso_unsplit": self.gso_unsplit.load(R),
        })
    }
}

/// State shared between a direction's forwarding thread and the control socket.
pub struct DirShared {
    pub name: &'static str,
    seed_mix: u64,
    spec_json: Mutex<Value>,
    pending: Mutex<Option<Option<Netem>>>,
    gen: AtomicU64,
    pub counters: Counters,
    /// Whether the forwarding thread runs with SCHED_FIFO.
    pub realtime: AtomicBool,
    pub rx: Arc<PacketSocket>,
    pub tx: Arc<PacketSocket>,
    /// The trace link's progress as the forwarding thread last left it (None: no trace), for
    /// `show` to count delivery opportunities used and wasted at the moment it is asked.
    trace: Mutex<Option<TraceLink>>,
}

impl DirShared {
    pub fn new(name: &'static str, seed_mix: u64, rx: Arc<PacketSocket>, tx: Arc<PacketSocket>) -> DirShared {
        DirShared {
            name,
            seed_mix,
            spec_json: Mutex::new(json!({})),
            pending: Mutex::new(None),
            gen: AtomicU64::new(0),
            counters: Counters::default(),
            realtime: AtomicBool::new(false),
            rx,
            tx,
            trace: Mutex::new(None),
        }
    }

    /// Validate a spec (without applying it).
    pub fn build(&self, spec: &Value) -> Result<Netem, String> {
        Netem::from_json(spec, self.seed_mix)
    }

    /// Replace the whole spec of this direction; the forwarding thread picks it up at its next
    /// loop iteration.
    pub fn apply(&self, spec: Value, model: Netem) {
        let model = if model.is_passthrough() { None } else { Some(model) };
        *self.pending.lock().unwrap() = Some(model);
        *self.spec_json.lock().unwrap() = spec;
        self.gen.fetch_add(1, Ordering::Release);
    }

    pub fn show(&self) -> Value {
        let (_, drops) = self.rx.take_stats();
        self.counters.dropped_rx.fetch_add(drops, R);
        let mut out = json!({
            "spec": self.spec_json.lock().unwrap().clone(),
            "counters": self.counters.to_json(),
            "realtime": self.realtime.load(R),
        });
        if let Some(link) = self.trace.lock().unwrap().as_ref() {
            let c = link.counts(now_ns());
            out["trace"] = json!({
                "opportunities": c.opportunities,
                "used": c.used,
                "wasted": c.wasted,
                "bytes_per_opportunity": crate::trace::MTU_BYTES,
                "lines": link.trace.ms.len(),
                "period_ms": link.trace.period_ms,
                // CLOCK_MONOTONIC of the trace's millisecond 0 (to line a capture up with it)
                "start_ns": link.start_ns,
            });
        }
        out
    }
}

struct Entry {
    tts: u64,
    seq: u64,
    buf: Vec<u8>,
}

impl PartialEq for Entry {
    fn eq(&self, o: &Self) -> bool {
        self.tts == o.tts && self.seq == o.seq
    }
}
impl Eq for Entry {}
impl PartialOrd for Entry {
    fn partial_cmp(&self, o: &Self) -> Option<CmpOrdering> {
        Some(self.cmp(o))
    }
}
impl Ord for Entry {
    // Reversed: BinaryHeap is a max-heap, we want the earliest (tts, seq) on top.
    fn cmp(&self, o: &Self) -> CmpOrdering {
        (o.tts, o.seq).cmp(&(self.tts, self.seq))
    }
}

const SMALL_BUF: usize = 2048 + VNET_HDR_LEN;
const POOL_MAX: usize = 8192;
const IDLE_POLL_MS: i32 = 100;
/// While frames wait for a delay of at least 4x this, arrivals are read every COALESCE_NS instead
/// of one wake-up per frame; their delay still counts from the kernel's receive timestamp.
const COALESCE_NS: u64 = 200_000;

pub struct Forwarder {
    shared: Arc<DirShared>,
    stop: Arc<AtomicBool>,
    gen: u64,
    netem: Option<Netem>,
    heap: BinaryHeap<Entry>,
    seq: u64,
    max_tts: u64,
    pool: Vec<Vec<u8>>,
    tx: TxBatch,
    timerfd: i32,
    /// How long before a deadline the timer fires; the rest is spun. Adapts to wake-up latency.
    lead_ns: u64,
    rt_prio: i32,
    rt_on: bool,
    /// Upper bound of that spin: spinning burns CPU the measured traffic needs (two cores are
    /// shared by every node), so it stays short; 0 = sleep only.
    max_lead_ns: u64,
}

impl Forwarder {
    pub fn new(shared: Arc<DirShared>, stop: Arc<AtomicBool>, max_spin_ns: u64, rt_prio: i32) -> Forwarder {
        let timerfd = unsafe { libc::timerfd_create(libc::CLOCK_MONOTONIC, libc::TFD_NONBLOCK | libc::TFD_CLOEXEC) };
        Forwarder {
            shared,
            stop,
            gen: 0,
            netem: None,
            heap: BinaryHeap::new(),
            seq: 0,
            max_tts: 0,
            pool: Vec::new(),
            tx: TxBatch::new(),
            timerfd,
            lead_ns: max_spin_ns.min(20_000),
            max_lead_ns: max_spin_ns,
            rt_prio,
            rt_on: false,
        }
    }

    fn get_buf(&mut self, data: &[u8]) -> Vec<u8> {
        let mut b = if data.len() <= SMALL_BUF {
            self.pool.pop().unwrap_or_else(|| Vec::with_capacity(SMALL_BUF))
        } else {
            Vec::with_capacity(data.len())
        };
        b.clear();
        b.extend_from_slice(data);
        b
    }

    fn recycle(&mut self, b: Vec<u8>) {
        if b.capacity() == SMALL_BUF && self.pool.len() < POOL_MAX {
            self.pool.push(b);
        }
    }

    fn reload(&mut self) {
        let g = self.shared.gen.load(Ordering::Acquire);
        if g != self.gen {
            self.gen = g;
            if let Some(mut m) = self.shared.pending.lock().unwrap().take() {
                // a trace's millisecond 0 is when its spec takes effect here
                if let Some(n) = m.as_mut() {
                    n.start_trace(now_ns());
                }
                *self.shared.trace.lock().unwrap() = m.as_ref().and_then(|n| n.trace.clone());
                self.netem = m;
            }

        }
    }

    fn flush(&mut self) {
        if self.tx.frames.is_empty() {
            return;
        }
        let (sent, failed, bytes) = self.tx.flush(self.shared.tx.fd);
        let c = &self.shared.counters;
        c.forwarded.fetch_add(sent as u64, R);
        c.bytes.fetch_add(bytes, R);
        if failed > 0 {
            c.tx_errors.fetch_add(failed as u64, R);
        }
        let frames = std::mem::take(&mut self.tx.frames);
        let mut frames = frames;
        for b in frames.drain(..) {
            self.recycle(b);
        }
        self.tx.frames = frames;
    }

    fn send_or_queue(&mut self, buf: Vec<u8>, tts: u64, now: u64) {
        if tts <= now && self.heap.is_empty() {
            self.tx.frames.push(buf);
            if self.tx.is_full() {
                self.flush();
            }
        } else {
            self.seq += 1;
            if self.heap.is_empty() || tts > self.max_tts {
                self.max_tts = tts;
            }
            self.heap.push(Entry { tts, seq: self.seq, buf });
        }
    }

    /// The limit / reorder / delay stage (after duplicate, loss and corrupt).
    fn schedule(&mut self, buf: Vec<u8>, now: u64) {
        let qlen = self.heap.len();
        let last = if qlen > 0 { Some(self.max_tts) } else { None };
        let sched = match self.netem.as_mut() {
            Some(n) => {
                let s = n.schedule(buf.len() - VNET_HDR_LEN, now, qlen, last);
                if let (Some(link), Sched::At(_)) = (n.trace.as_ref(), s) {
                    self.shared.trace.lock().unwrap().clone_from(&Some(link.clone()));
                }
                s
            }
            None => Sched::At(now),
        };
        match sched {
            Sched::DropLimit => {
                self.shared.counters.dropped_limit.fetch_add(1, R);
                self.recycle(buf);
            }
            Sched::Reorder(t) => {
                self.shared.counters.reordered.fetch_add(1, R);
                // Head of the queue: before everything already waiting (netem: enqueue_head).
                let _ = t;
                self.seq += 1;
                let s = self.seq;
                if self.heap.is_empty() {
                    self.max_tts = 0;
                }
                self.heap.push(Entry { tts: 0, seq: s, buf });
            }
            Sched::At(t) => self.send_or_queue(buf, t, now),
        }
    }

    /// Corrupt (if selected) then schedule; `buf` is vnet header + frame.
    fn corrupt_and_schedule(&mut self, mut buf: Vec<u8>, now: u64) {
        let corrupt = self.netem.as_mut().map(|n| n.corrupt_event()).unwrap_or(false);
        if !corrupt {
            return self.schedule(buf, now);
        }
        self.shared.counters.corrupted.fetch_add(1, R);
        let hdr = VnetHdr::parse(&buf);
        if hdr.is_gso() {
            if let Some(segs) = csum::segment(&buf, true) {
                // As netem_segment(): corrupt the first segment; the others go through the whole
                // enqueue path as packets of their own.
                self.recycle(buf);
                let mut it = segs.into_iter();
                let mut first = it.next().unwrap();
                csum::flip_random_bit(&mut first, &mut self.netem.as_mut().unwrap().rng);
                self.schedule(first, now);
                for s in it {
                    self.enqueue(s, now, true);
                }
                return;
            }
            // Unknown GSO type: flip a bit in the headers' checksum-covered part as a best effort.
        }
        csum::complete_checksum(&mut buf);
        csum::flip_random_bit(&mut buf, &mut self.netem.as_mut().unwrap().rng);
        self.schedule(buf, now);
    }

    /// netem_enqueue(): duplicate, loss, corrupt, limit, reorder/delay.
    fn enqueue(&mut self, buf: Vec<u8>, now: u64, allow_dup: bool) {
        let Some(n) = self.netem.as_mut() else {
            return self.schedule(buf, now);
        };
        let mut count = 1;
        if allow_dup && n.duplicate_event() {
            count += 1;
        }
        if n.loss_event() {
            count -= 1;
        }
        if count == 0 {
            self.shared.counters.dropped_loss.fetch_add(1, R);
            return self.recycle(buf);
        }
        let dup = if count > 1 {
            self.shared.counters.duplicated.fetch_add(1, R);
            Some(self.get_buf(&buf))
        } else {
            None
        };
        self.corrupt_and_schedule(buf, now);
        if let Some(d) = dup {
            // The copy goes through the whole path again with duplication off (netem).
            self.enqueue(d, now, false);
        }
    }

    fn dequeue_due(&mut self, now: u64) {
        while let Some(top) = self.heap.peek() {
            if top.tts > now {
                break;
            }
            let e = self.heap.pop().unwrap();
            self.tx.frames.push(e.buf);
            if self.tx.is_full() {
                self.flush();
            }
        }
        self.flush();
        let c = &self.shared.counters;
        let depth = self.heap.len() as u64;
        c.queue_depth.store(depth, R);
        if depth > c.queue_depth_max.load(R) {
            c.queue_depth_max.store(depth, R);
        }
    }

    /// Sleep until a frame arrives or the next deadline, whichever is first.
    fn wait(&mut self) {
        let rxfd = self.shared.rx.fd;
        let Some(tts) = self.heap.peek().map(|e| e.tts) else {
            let mut p = libc::pollfd { fd: rxfd, events: libc::POLLIN, revents: 0 };
            unsafe { libc::poll(&mut p, 1, IDLE_POLL_MS) };
            return;
        };
        let now = now_ns();
        if tts <= now {
            return;
        }
        if tts - now <= self.lead_ns {
            while now_ns() < tts {
                std::hint::spin_loop();
            }
            return;
        }
        let coalesce = self.netem.as_ref().map(|n| n.latency_ns >= 4 * COALESCE_NS as i64).unwrap_or(false);
        let wake = tts - self.lead_ns;
        if coalesce && wake > now + COALESCE_NS {
            // Do not wake for every arrival: sleep until the deadline or COALESCE_NS.
            let t = now + COALESCE_NS;
            let ts = libc::timespec { tv_sec: (t / 1_000_000_000) as i64, tv_nsec: (t % 1_000_000_000) as i64 };
            unsafe { libc::clock_nanosleep(libc::CLOCK_MONOTONIC, libc::TIMER_ABSTIME, &ts, std::ptr::null_mut()) };
            return;
        }
        let spec = libc::itimerspec {
            it_interval: libc::timespec { tv_sec: 0, tv_nsec: 0 },
            it_value: libc::timespec { tv_sec: (wake / 1_000_000_000) as i64, tv_nsec: (wake % 1_000_000_000) as i64 },
        };
        unsafe { libc::timerfd_settime(self.timerfd, libc::TFD_TIMER_ABSTIME, &spec, std::ptr::null_mut()) };
        let mut p = [
            libc::pollfd { fd: rxfd, events: libc::POLLIN, revents: 0 },
            libc::pollfd { fd: self.timerfd, events: libc::POLLIN, revents: 0 },
        ];
        let timeout = (((wake - now) / 1_000_000) as i32 + 2).min(IDLE_POLL_MS);
        unsafe { libc::poll(p.as_mut_ptr(), 2, timeout) };
        if p[1].revents & libc::POLLIN != 0 {
            let mut v = 0u64;
            unsafe { libc::read(self.timerfd, &mut v as *mut u64 as *mut libc::c_void, 8) };
            // Adapt the lead to the observed wake-up latency (EWMA, kept within 5..200 us).
            let late = now_ns().saturating_sub(wake);
            let target = (late * 2 + 2_000).min(self.max_lead_ns);
            self.lead_ns = (self.lead_ns * 7 + target) / 8;
        }
    }

    /// netem runs in softirq context, ahead of every task; the closest userspace equivalent is a
    /// SCHED_FIFO thread (also in pass-through: as SCHED_OTHER on a loaded host the engine was
    /// measured starved for tens of ms). Best effort: a cgroup without RT runtime refuses it.
    fn set_realtime(&mut self, on: bool) {
        let on = on && self.rt_prio > 0;
        if on == self.rt_on {
            return;
        }
        let (policy, prio) = if on { (libc::SCHED_FIFO, self.rt_prio) } else { (libc::SCHED_OTHER, 0) };
        let p = libc::sched_param { sched_priority: prio };
        let ok = unsafe { libc::sched_setscheduler(0, policy, &p) } == 0;
        self.rt_on = if ok { on } else { false };
        self.shared.realtime.store(self.rt_on, R);
    }

    pub fn run(mut self) {
        // Precise timers: the default 50 us timer slack would be the whole error budget.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1, 0, 0, 0) };
        self.set_realtime(true);
        let rxfd = self.shared.rx.fd;
        let txfd = self.shared.tx.fd;
        let mut rx = RxBatch::new();
        let mut scratch = Vec::with_capacity(crate::pkt::RX_BATCH);
        let mut iovs = Vec::with_capacity(crate::pkt::RX_BATCH);
        while !self.stop.load(R) {
            self.reload();
            if !self.heap.is_empty() {
                self.dequeue_due(now_ns());
            }
            let n = match rx.recv(rxfd) {
                Ok(n) => n,
                Err(e) => {
                    eprintln!("lab-impaird: {}: receive failed: {e}", self.shared.rx.name);
                    std::thread::sleep(std::time::Duration::from_millis(10));
                    0
                }
            };
            if n == 0 {
                if rx.truncated > 0 {
                    self.shared.counters.truncated.fetch_add(std::mem::take(&mut rx.truncated), R);
                }
                self.wait();
                continue;
            }
            let c = &self.shared.counters;
            let valid = rx.lens[..n].iter().filter(|&&l| l > 0).count() as u64;
            c.seen.fetch_add(valid, R);
            if self.netem.is_none() && self.heap.is_empty() {
                let (sent, failed, bytes) = forward_rx(txfd, &mut rx, n, &mut scratch, &mut iovs);
                c.forwarded.fetch_add(sent as u64, R);
                c.bytes.fetch_add(bytes, R);
                if failed > 0 {
                    c.tx_errors.fetch_add(failed as u64, R);
                }
                continue;
            }
            let now = now_ns();
            // Kernel receive stamps are CLOCK_REALTIME; map them onto CLOCK_MONOTONIC.
            let real_now = crate::clock_ns(libc::CLOCK_REALTIME);
            for i in 0..n {
                let len = rx.lens[i];
                if len == 0 {
                    continue;
                }
                let stamp = rx.stamps[i];
                let arrived = if stamp != 0 && stamp <= real_now { now.saturating_sub(real_now - stamp) } else { now };
                let frame = &rx.bufs[i][..len];
                if VnetHdr::parse(frame).is_gso() {
                    // A super-frame from a TSO/GSO/GRO path: every model acts per wire packet
                    // (a 1 % loss drops 1 % of MTU-sized packets, not 1 % of 64 KB bursts).
                    if let Some(segs) = csum::segment(frame, false) {
                        self.shared.counters.gso_frames.fetch_add(1, R);
                        self.shared.counters.gso_segments.fetch_add(segs.len() as u64, R);
                        for s in segs {
                            self.enqueue(s, arrived, true);
                        }
                        continue;
                    }
                    self.shared.counters.gso_unsplit.fetch_add(1, R);
                }
                let buf = self.get_buf(frame);
                self.enqueue(buf, arrived, true);
            }
            self.flush();
            if !self.heap.is_empty() {
                self.dequeue_due(now_ns());
            }
        }
    }
}
