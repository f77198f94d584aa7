//! The impairment spec (docs/impairment-spec.md) and the netem decision logic applied to each
//! packet. Everything here is pure (time is passed in) so the statistics can be unit-tested.
//!
//! Semantics follow net/sched/sch_netem.c: per packet, duplicate? then loss? (a lost original
//! with a duplicate leaves one copy), corrupt?, limit check, then either reorder (send now, ahead
//! of the queue) or delay = tabledist(latency, jitter) (+ serialisation time at `rate`, counted
//! from the last queued packet).

use crate::dist::{self, DistTable, NETEM_DIST_SCALE};
use crate::rng::{pct_to_u32, CRnd, Rng};
use crate::trace::{Trace, TraceLink, ETH_HLEN};
use serde_json::{Map, Value};
use std::sync::Arc;

pub const DEFAULT_LIMIT: u32 = 1000;

const KNOWN_KEYS: &[&str] = &[
    "delay_us", "jitter_us", "delay_corr_pct", "distribution", "loss", "duplicate_pct",
    "duplicate_corr_pct", "corrupt_pct", "corrupt_corr_pct", "reorder_pct", "reorder_corr_pct",
    "reorder_gap", "rate_bps", "rate_packet_overhead", "limit", "seed", "trace",
];

#[derive(Debug, Clone)]
pub enum Loss {
    None,
    Random { p: u32, cor: CRnd },
    /// netem 4-state Markov model (Salsano et al.); a1=p13 a2=p31 a3=p32 a4=p14 a5=p23.
    State { a1: u32, a2: u32, a3: u32, a4: u32, a5: u32, state: u8 },
    /// Gilbert-Elliott: p (good->bad), r (bad->good), loss probability in bad (1-h) / good (1-k).
    Ge { p: u32, r: u32, one_h: u32, one_k: u32, bad: bool },
}

// 4-state model states, numbered as in netem.
const TX_IN_GAP: u8 = 1;
const TX_IN_BURST: u8 = 2;
const LOST_IN_GAP: u8 = 3;
const LOST_IN_BURST: u8 = 4;

#[derive(Debug, Clone)]
pub struct Netem {
    pub latency_ns: i64,
    pub jitter_ns: i64,
    pub delay_cor: CRnd,
    pub dist: Option<Arc<DistTable>>,
    pub loss: Loss,
    pub dup: u32,
    pub dup_cor: CRnd,
    pub corrupt: u32,
    pub corrupt_cor: CRnd,
    pub reorder: u32,
    pub reorder_cor: CRnd,
    pub gap: u32,
    pub counter: u32,
    pub rate_bps: u64,
    pub overhead: i64,
    pub limit: u32,
    /// A trace-driven link (crate::trace): packets leave only at its delivery opportunities.
    /// Its clock starts when the forwarding thread takes the spec (`start_trace`).
    pub trace: Option<TraceLink>,
    pub rng: Rng,
}

/// Where the limit/reorder/delay stage puts a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sched {
    /// Queue full (`limit`): drop.
    DropLimit,
    /// Selected for reordering: send at `now`, ahead of everything queued.
    Reorder(u64),
    /// Send at this time.
    At(u64),
}

fn obj_f64(m: &Map<String, Value>, key: &str, lo: f64, hi: f64) -> Result<Option<f64>, String> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => {
            let x = v.as_f64().ok_or_else(|| format!("{key}: expected a number, got {v}"))?;
            if !(lo..=hi).contains(&x) || x.is_nan() {
                return Err(format!("{key}: {x} out of range [{lo}, {hi}]"));
            }
            Ok(Some(x))
        }
    }
}

fn obj_u64(m: &Map<String, Value>, key: &str, hi: u64) -> Result<Option<u64>, String> {
    match m.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => {
            let x = v.as_u64().ok_or_else(|| format!("{key}: expected a non-negative integer, got {v}"))?;
            if x > hi {
                return Err(format!("{key}: {x} larger than {hi}"));
            }
            Ok(Some(x))
        }
    }
}

fn pct(m: &Map<String, Value>, key: &str) -> Result<Option<f64>, String> {
    obj_f64(m, key, 0.0, 100.0)
}

fn parse_loss(v: &Value, rng: &mut Rng) -> Result<Loss, String> {
    let m = v.as_object().ok_or("loss: expected an object")?;
    let model = m.get("model").and_then(Value::as_str).unwrap_or("random");
    let allowed: &[&str] = match model {
        "random" => &["model", "p_pct", "corr_pct"],
        "state" => &["model", "p13", "p31", "p32", "p23", "p14"],
        "gemodel" => &["model", "p", "r", "one_h", "one_k"],
        other => return Err(format!("loss.model: unknown {other:?}; accepted: random, state, gemodel")),
    };
    for k in m.keys() {
        if !allowed.contains(&k.as_str()) {
            return Err(format!("loss: unknown field {k:?} for model {model}; accepted: {}", allowed.join(", ")));
        }
    }
    let g = |k: &str| pct(m, k).map_err(|e| format!("loss.{e}"));
    Ok(match model {
        "random" => {
            let p = g("p_pct")?.unwrap_or(0.0);
            if p == 0.0 {
                Loss::None
            } else {
                Loss::Random { p: pct_to_u32(p), cor: CRnd::new(pct_to_u32(g("corr_pct")?.unwrap_or(0.0)), rng) }
            }
        }
        "state" => {
            // tc-netem defaults: p31 = 100 - p13, p32 = 0, p23 = 100, p14 = 0.
            let p13 = g("p13")?.ok_or("loss.p13: required for model state")?;
            let p31 = g("p31")?.unwrap_or(100.0 - p13);
            Loss::State {
                a1: pct_to_u32(p13),
                a2: pct_to_u32(p31),
                a3: pct_to_u32(g("p32")?.unwrap_or(0.0)),
                a4: pct_to_u32(g("p14")?.unwrap_or(0.0)),
                a5: pct_to_u32(g("p23")?.unwrap_or(100.0)),
                state: TX_IN_GAP,
            }
        }
        _ => {
            // tc-netem defaults: r = 100 - p, 1-h = 100, 1-k = 0.
            let p = g("p")?.ok_or("loss.p: required for model gemodel")?;
            Loss::Ge {
                p: pct_to_u32(p),
                r: pct_to_u32(g("r")?.unwrap_or(100.0 - p)),
                one_h: pct_to_u32(g("one_h")?.unwrap_or(100.0)),
                one_k: pct_to_u32(g("one_k")?.unwrap_or(0.0)),
                bad: false,
            }
        }
    })
}

impl Netem {
    /// Build from the JSON spec. `seed_mix` differentiates the two directions when one seed is
    /// given for both. Unknown fields are rejected so a producer/consumer mismatch is loud.
    pub fn from_json(v: &Value, seed_mix: u64) -> Result<Netem, String> {
        let m = v.as_object().ok_or("spec: expected a JSON object")?;
        for k in m.keys() {
            if !KNOWN_KEYS.contains(&k.as_str()) {
                return Err(format!("spec: unknown field {k:?}; accepted: {}", KNOWN_KEYS.join(", ")));
            }
        }
        let mut rng = match obj_u64(m, "seed", u64::MAX)? {
            Some(s) => Rng::new(s ^ seed_mix),
            None => Rng::from_entropy(),
        };
        let latency_us = obj_f64(m, "delay_us", 0.0, 3_600e6)?.unwrap_or(0.0);
        let jitter_us = obj_f64(m, "jitter_us", 0.0, 2_000_000.0)?.unwrap_or(0.0);
        let dist = match m.get("distribution") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if s == "uniform" => None,
            Some(Value::String(s)) if ["normal", "pareto", "paretonormal"].contains(&s.as_str()) => Some(dist::load(s)?),
            Some(other) => {
                return Err(format!("distribution: {other} not accepted; accepted: uniform, normal, pareto, paretonormal"))
            }
        };
        let delay_cor = CRnd::new(pct_to_u32(pct(m, "delay_corr_pct")?.unwrap_or(0.0)), &mut rng);
        let loss = match m.get("loss") {
            None | Some(Value::Null) => Loss::None,
            Some(l) => parse_loss(l, &mut rng)?,
        };
        let dup = pct_to_u32(pct(m, "duplicate_pct")?.unwrap_or(0.0));
        let dup_cor = CRnd::new(pct_to_u32(pct(m, "duplicate_corr_pct")?.unwrap_or(0.0)), &mut rng);
        let corrupt = pct_to_u32(pct(m, "corrupt_pct")?.unwrap_or(0.0));
        let corrupt_cor = CRnd::new(pct_to_u32(pct(m, "corrupt_corr_pct")?.unwrap_or(0.0)), &mut rng);
        let reorder_pct = pct(m, "reorder_pct")?.unwrap_or(0.0);
        let reorder = pct_to_u32(reorder_pct);
        let reorder_cor = CRnd::new(pct_to_u32(pct(m, "reorder_corr_pct")?.unwrap_or(0.0)), &mut rng);
        let mut gap = obj_u64(m, "reorder_gap", u32::MAX as u64)?.unwrap_or(0) as u32;
        if reorder_pct > 0.0 {
            if latency_us <= 0.0 {
                return Err("reorder_pct: reordering needs delay_us > 0 (as tc-netem)".into());
            }
            if gap == 0 {
                gap = 1; // tc sets gap 1 when reorder is given without gap
            }
        }
        let rate_bps = obj_u64(m, "rate_bps", u64::MAX / 16)?.unwrap_or(0);
        let overhead = obj_f64(m, "rate_packet_overhead", -65535.0, 65535.0)?.unwrap_or(0.0) as i64;
        let limit = obj_u64(m, "limit", u32::MAX as u64)?.unwrap_or(DEFAULT_LIMIT as u64) as u32;
        let trace = match m.get("trace") {
            None | Some(Value::Null) => None,
            Some(t) => {
                if rate_bps != 0 {
                    return Err("trace: not with rate_bps (both set the link's capacity; give one)".into());
                }
                if reorder_pct > 0.0 {
                    return Err("trace: not with reorder_pct (a packet leaves only at a delivery opportunity)".into());
                }
                Some(TraceLink::new(Arc::new(Trace::from_json(t)?), 0))
            }
        };
        Ok(Netem {
            latency_ns: (latency_us * 1000.0).round() as i64,
            jitter_ns: (jitter_us * 1000.0).round() as i64,
            delay_cor,
            dist,
            loss,
            dup,
            dup_cor,
            corrupt,
            corrupt_cor,
            reorder,
            reorder_cor,
            gap,
            counter: 0,
            rate_bps,
            overhead,
            limit,
            trace,
            rng,
        })
    }

    /// Nothing to do: frames can go straight through (the fast path).
    pub fn is_passthrough(&self) -> bool {
        !self.needs_queue()
            && matches!(self.loss, Loss::None)
            && self.dup == 0
            && self.corrupt == 0
            && self.reorder == 0
            && self.limit > 0
    }

    /// Packets wait for a time (delay, jitter or rate), so the timer heap is used.
    pub fn needs_queue(&self) -> bool {
        self.latency_ns != 0 || self.jitter_ns != 0 || self.rate_bps != 0 || self.trace.is_some()
    }

    /// Millisecond 0 of the trace (if any) is `now`: called when the spec takes effect.
    pub fn start_trace(&mut self, now: u64) {
        if let Some(t) = self.trace.as_mut() {
            *t = TraceLink::new(t.trace.clone(), now);
        }
    }

    #[inline]
    pub fn duplicate_event(&mut self) -> bool {
        self.dup != 0 && self.dup >= self.dup_cor.next(&mut self.rng)
    }

    #[inline]
    pub fn corrupt_event(&mut self) -> bool {
        self.corrupt != 0 && self.corrupt >= self.corrupt_cor.next(&mut self.rng)
    }

    /// netem's loss_event(): random (with correlation), 4-state Markov, or Gilbert-Elliott.
    #[inline]
    pub fn loss_event(&mut self) -> bool {
        let rng = &mut self.rng;
        match &mut self.loss {
            Loss::None => false,
            Loss::Random { p, cor } => *p != 0 && *p >= cor.next(rng),
            Loss::State { a1, a2, a3, a4, a5, state } => {
                let rnd = rng.next_u32() as u64;
                let (a1, a2, a3, a4, a5) = (*a1 as u64, *a2 as u64, *a3 as u64, *a4 as u64, *a5 as u64);
                match *state {
                    TX_IN_GAP => {
                        if rnd < a4 {
                            *state = LOST_IN_GAP;
                            true
                        } else if rnd < a1 + a4 {
                            *state = LOST_IN_BURST;
                            true
                        } else {
                            false
                        }
                    }
                    TX_IN_BURST => {
                        if rnd < a5 {
                            *state = LOST_IN_BURST;
                            true
                        } else {
                            false
                        }
                    }
                    LOST_IN_BURST => {
                        if rnd < a3 {
                            *state = TX_IN_BURST;
                            false
                        } else if rnd < a2 + a3 {
                            *state = TX_IN_GAP;
                            false
                        } else {
                            true
                        }
                    }
                    _ => {
                        // LOST_IN_GAP: an isolated loss, always followed by a transmission.
                        *state = TX_IN_GAP;
                        false
                    }
                }
            }
            Loss::Ge { p, r, one_h, one_k, bad } => {
                // As netem: first the state transition, then the loss draw in the new state.
                if !*bad {
                    if rng.next_u32() < *p {
                        *bad = true;
                    }
                } else if rng.next_u32() < *r {
                    *bad = false;
                }
                let pl = if *bad { *one_h } else { *one_k };
                pl != 0 && (pl == u32::MAX || rng.next_u32() < pl)
            }
        }
    }

    /// netem's tabledist(): mu + sigma * table[rnd] / 8192 (or uniform in [mu - sigma, mu + sigma)).
    #[inline]
    pub fn tabledist(&mut self) -> i64 {
        let (mu, sigma) = (self.latency_ns, self.jitter_ns);
        if sigma == 0 {
            return mu;
        }
        let rnd = self.delay_cor.next(&mut self.rng) as i64;
        match &self.dist {
            None => (rnd % (2 * sigma)) + mu - sigma,
            Some(d) => {
                let t = d.table[(rnd as usize) % d.table.len()] as i64;
                let mut x = (sigma % NETEM_DIST_SCALE) * t;
                if x >= 0 {
                    x += NETEM_DIST_SCALE / 2;
                } else {
                    x -= NETEM_DIST_SCALE / 2;
                }
                x / NETEM_DIST_SCALE + (sigma / NETEM_DIST_SCALE) * t + mu
            }
        }
    }

    /// Serialisation time of a frame of `len` bytes at `rate_bps` (with per-packet overhead).
    #[inline]
    pub fn packet_time_ns(&self, len: usize) -> i64 {
        if self.rate_bps == 0 {
            return 0;
        }
        let bits = ((len as i64 + self.overhead).max(0) as u128) * 8;
        (bits * 1_000_000_000 / self.rate_bps as u128) as i64
    }

    /// The limit / reorder / delay stage for one packet. `qlen` is the current queue length and
    /// `last_tts` the latest send time in the queue (the reference point when `rate` is set).
    pub fn schedule(&mut self, len: usize, now: u64, qlen: usize, last_tts: Option<u64>) -> Sched {
        if qlen >= self.limit as usize {
            return Sched::DropLimit;
        }
        if let Some(link) = self.trace.as_mut() {
            // the link first (its FIFO and opportunities), then the delay after it (as
            // `mm-link` inside `mm-delay` on the way out); reorder is refused with a trace
            let departure = link.depart(now, len.saturating_sub(ETH_HLEN) as u64);
            let delay = self.tabledist().max(0);
            return Sched::At(departure + delay as u64);
        }
        if self.gap == 0 || self.counter < self.gap - 1 || self.reorder < self.reorder_cor.next(&mut self.rng) {
            let mut delay = self.tabledist();
            let mut reference = now as i64;
            if self.rate_bps != 0 {
                if let Some(last) = last_tts {
                    // The last queued packet is the reference: take the time it still has to
                    // wait off this packet's delay (netem_enqueue()).
                    delay = (delay - (last as i64 - now as i64)).max(0);
                    reference = last as i64;
                }
                delay += self.packet_time_ns(len);
            }
            self.counter = self.counter.wrapping_add(1);
            Sched::At((reference + delay).max(0) as u64)
        } else {
            self.counter = 0;
            Sched::Reorder(now)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn netem(v: Value) -> Netem {
        Netem::from_json(&v, 0).unwrap()
    }

    fn mean_sd(xs: &[f64]) -> (f64, f64) {
        let n = xs.len() as f64;
        let m = xs.iter().sum::<f64>() / n;
        (m, (xs.iter().map(|x| (x - m).powi(2)).sum::<f64>() / n).sqrt())
    }

    #[test]
    fn empty_spec_is_passthrough() {
        assert!(netem(json!({})).is_passthrough());
        assert!(netem(json!({"limit": 10, "seed": 1})).is_passthrough());
        assert!(!netem(json!({"delay_us": 1})).is_passthrough());
        assert!(!netem(json!({"loss": {"model": "random", "p_pct": 1}})).is_passthrough());
    }

    #[test]
    fn rejects_bad_input() {
        for bad in [
            json!({"delay": 5}),
            json!({"delay_us": -1}),
            json!({"loss": {"model": "bursty"}}),
            json!({"loss": {"model": "random", "p": 1}}),
            json!({"duplicate_pct": 101}),
            json!({"distribution": "cauchy", "jitter_us": 5}),
            json!({"reorder_pct": 10}),
            json!([1, 2]),
        ] {
            assert!(Netem::from_json(&bad, 0).is_err(), "accepted {bad}");
        }
    }

    #[test]
    fn constant_delay() {
        let mut n = netem(json!({"delay_us": 40000, "seed": 1}));
        assert_eq!(n.schedule(100, 1000, 0, None), Sched::At(1000 + 40_000_000));
    }

    #[test]
    fn uniform_jitter_range_and_sd() {
        let mut n = netem(json!({"delay_us": 10000, "jitter_us": 2000, "seed": 2}));
        let xs: Vec<f64> = (0..100_000).map(|_| n.tabledist() as f64).collect();
        assert!(xs.iter().all(|&x| (8_000_000.0..12_000_000.0).contains(&x)));
        let (m, sd) = mean_sd(&xs);
        assert!((m - 10e6).abs() < 20e3, "mean {m}");
        let expect = 2e6 / 3f64.sqrt();
        assert!((sd / expect - 1.0).abs() < 0.02, "sd {sd} vs {expect}");
    }

    #[test]
    fn normal_jitter_sd() {
        let mut n = netem(json!({"delay_us": 40000, "jitter_us": 5000, "distribution": "normal", "seed": 3}));
        let xs: Vec<f64> = (0..200_000).map(|_| n.tabledist() as f64).collect();
        let (m, sd) = mean_sd(&xs);
        assert!((m - 40e6).abs() < 50e3, "mean {m}");
        assert!((sd / 5e6 - 1.0).abs() < 0.03, "sd {sd}");
    }

    #[test]
    fn pareto_distributions_load() {
        for d in ["pareto", "paretonormal"] {
            let mut n = netem(json!({"delay_us": 40000, "jitter_us": 5000, "distribution": d, "seed": 4}));
            let xs: Vec<f64> = (0..50_000).map(|_| n.tabledist() as f64).collect();
            let (_, sd) = mean_sd(&xs);
            assert!(sd > 3e6 && sd < 7e6, "{d} sd {sd}");
        }
    }

    #[test]
    fn random_loss_rate() {
        let mut n = netem(json!({"loss": {"model": "random", "p_pct": 1.0}, "seed": 5}));
        let lost = (0..1_000_000).filter(|_| n.loss_event()).count() as f64;
        // 99.9 % interval of Binomial(1e6, 0.01) is about +-330.
        assert!((lost - 10_000.0).abs() < 330.0, "lost {lost}");
    }

    #[test]
    fn random_loss_ten_percent() {
        let mut n = netem(json!({"loss": {"model": "random", "p_pct": 10.0, "corr_pct": 0}, "seed": 6}));
        let seq: Vec<bool> = (0..200_000).map(|_| n.loss_event()).collect();
        let rate = seq.iter().filter(|&&x| x).count() as f64 / seq.len() as f64;
        assert!((rate - 0.10).abs() < 0.005, "rate {rate}");
    }

    fn bursts(seq: &[bool]) -> Vec<usize> {
        let mut out = vec![];
        let mut run = 0;
        for &l in seq {
            if l {
                run += 1;
            } else if run > 0 {
                out.push(run);
                run = 0;
            }
        }
        out
    }

    #[test]
    fn gemodel_burst_length_and_rate() {
        // p = 1 %, r = 25 %, 1-h = 100 %, 1-k = 0: loss = p / (p + r), mean burst = 1 / r = 4.
        let mut n = netem(json!({"loss": {"model": "gemodel", "p": 1.0, "r": 25.0}, "seed": 7}));
        let seq: Vec<bool> = (0..2_000_000).map(|_| n.loss_event()).collect();
        let rate = seq.iter().filter(|&&x| x).count() as f64 / seq.len() as f64;
        assert!((rate / (1.0 / 26.0) - 1.0).abs() < 0.05, "rate {rate}");
        let b = bursts(&seq);
        let mean = b.iter().sum::<usize>() as f64 / b.len() as f64;
        assert!((mean / 4.0 - 1.0).abs() < 0.05, "mean burst {mean}");
    }

    #[test]
    fn gemodel_defaults() {
        // r defaults to 100 - p: with p = 10 %, r = 90 %, mean burst 1/0.9.
        let mut n = netem(json!({"loss": {"model": "gemodel", "p": 10.0}, "seed": 8}));
        let seq: Vec<bool> = (0..1_000_000).map(|_| n.loss_event()).collect();
        let rate = seq.iter().filter(|&&x| x).count() as f64 / seq.len() as f64;
        assert!((rate - 0.10).abs() < 0.003, "rate {rate}");
    }

    #[test]
    fn state_model_only_p13_is_bernoulli() {
        let mut n = netem(json!({"loss": {"model": "state", "p13": 5.0}, "seed": 9}));
        let seq: Vec<bool> = (0..1_000_000).map(|_| n.loss_event()).collect();
        let rate = seq.iter().filter(|&&x| x).count() as f64 / seq.len() as f64;
        assert!((rate - 0.05).abs() < 0.002, "rate {rate}");
    }

    #[test]
    fn state_model_bursts() {
        // 2-state Gilbert from the 4-state model: p13 = 2 %, p31 = 20 % -> mean burst 5.
        let mut n = netem(json!({"loss": {"model": "state", "p13": 2.0, "p31": 20.0}, "seed": 10}));
        let seq: Vec<bool> = (0..2_000_000).map(|_| n.loss_event()).collect();
        let b = bursts(&seq);
        let mean = b.iter().sum::<usize>() as f64 / b.len() as f64;
        assert!((mean / 5.0 - 1.0).abs() < 0.05, "mean burst {mean}");
    }

    #[test]
    fn duplicate_and_corrupt_rates() {
        let mut n = netem(json!({"duplicate_pct": 3.0, "corrupt_pct": 2.0, "seed": 11}));
        let d = (0..500_000).filter(|_| n.duplicate_event()).count() as f64 / 500_000.0;
        let c = (0..500_000).filter(|_| n.corrupt_event()).count() as f64 / 500_000.0;
        assert!((d - 0.03).abs() < 0.002, "dup {d}");
        assert!((c - 0.02).abs() < 0.002, "corrupt {c}");
    }

    #[test]
    fn reorder_gap_every_nth() {
        // reorder 100 % gap 5: packets 5, 10, 15 ... go out immediately, the rest wait.
        let mut n = netem(json!({"delay_us": 10000, "reorder_pct": 100, "reorder_gap": 5, "seed": 12}));
        let pattern: Vec<bool> = (0..20).map(|_| matches!(n.schedule(100, 0, 0, None), Sched::Reorder(_))).collect();
        let expect: Vec<bool> = (1..=20).map(|i| i % 5 == 0).collect();
        assert_eq!(pattern, expect);
    }

    #[test]
    fn reorder_probability_without_gap() {
        let mut n = netem(json!({"delay_us": 10000, "reorder_pct": 25, "seed": 13}));
        assert_eq!(n.gap, 1);
        let r = (0..200_000).filter(|_| matches!(n.schedule(100, 0, 0, None), Sched::Reorder(_))).count() as f64;
        assert!((r / 200_000.0 - 0.25).abs() < 0.005, "reorder {r}");
    }

    #[test]
    fn reorder_with_gap_and_probability() {
        // gap 4, 50 %: after 3 delayed packets each packet is reordered with p = 0.5.
        let mut n = netem(json!({"delay_us": 10000, "reorder_pct": 50, "reorder_gap": 4, "seed": 14}));
        let mut since = 0;
        let mut reordered = 0;
        for _ in 0..100_000 {
            if let Sched::Reorder(_) = n.schedule(100, 0, 0, None) {
                assert!(since >= 3, "reordered after only {since} delayed packets");
                since = 0;
                reordered += 1;
            } else {
                since += 1;
            }
        }
        // mean cycle = 3 + 2 packets -> 1 in 5 reordered
        assert!((reordered as f64 / 100_000.0 - 0.2).abs() < 0.01, "{reordered}");
    }

    #[test]
    fn limit_drops() {
        let mut n = netem(json!({"delay_us": 1000, "limit": 3}));
        assert!(matches!(n.schedule(100, 0, 2, None), Sched::At(_)));
        assert_eq!(n.schedule(100, 0, 3, None), Sched::DropLimit);
    }

    #[test]
    fn rate_serialises_after_last_packet() {
        // 8 Mbit/s, 1000-byte frames -> 1 ms each; with overhead 0 and no delay.
        let mut n = netem(json!({"rate_bps": 8_000_000}));
        assert_eq!(n.schedule(1000, 0, 0, None), Sched::At(1_000_000));
        assert_eq!(n.schedule(1000, 0, 1, Some(1_000_000)), Sched::At(2_000_000));
        // overhead counts
        let mut n = netem(json!({"rate_bps": 8_000_000, "rate_packet_overhead": 1000}));
        assert_eq!(n.schedule(1000, 0, 0, None), Sched::At(2_000_000));
        // with delay: the delay is reduced by the time the last packet still waits
        let mut n = netem(json!({"rate_bps": 8_000_000, "delay_us": 10000}));
        assert_eq!(n.schedule(1000, 0, 0, None), Sched::At(11_000_000));
        assert_eq!(n.schedule(1000, 0, 1, Some(11_000_000)), Sched::At(12_000_000));
    }

    #[test]
    fn trace_then_delay() {
        // 1 ms trace, 514-byte frames (500 IP bytes): three per opportunity, then 10 ms delay
        let mut n = netem(json!({"trace": {"path": "x", "ms": [1]}, "delay_us": 10000}));
        n.start_trace(0);
        let t: Vec<Sched> = (0..4).map(|q| n.schedule(514, 0, q, None)).collect();
        let ms = 1_000_000;
        assert_eq!(t, vec![Sched::At(11 * ms), Sched::At(11 * ms), Sched::At(11 * ms), Sched::At(12 * ms)]);
        assert!(!n.is_passthrough());
        // the queue limit still applies in front of the link
        let mut n = netem(json!({"trace": {"ms": [1]}, "limit": 2}));
        assert_eq!(n.schedule(1514, 0, 2, Some(0)), Sched::DropLimit);
    }

    #[test]
    fn trace_refuses_rate_and_reorder() {
        for bad in [
            json!({"trace": {"ms": [1]}, "rate_bps": 1000000}),
            json!({"trace": {"ms": [1]}, "delay_us": 1000, "reorder_pct": 5}),
            json!({"trace": {"ms": []}}),
            json!({"trace": [1, 2]}),
        ] {
            assert!(Netem::from_json(&bad, 0).is_err(), "accepted {bad}");
        }
    }
}
