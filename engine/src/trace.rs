//! Trace-driven links (the `trace` field of a spec): a link whose capacity is a list of delivery
//! opportunities, in the file format of Mahimahi's link shell (mm-link): one line per
//! opportunity, the millisecond (from the start of the trace) at which up to MTU_BYTES may leave.
//! The list repeats when it ends, shifted by its last timestamp (the period), so the opportunity
//! with absolute index n is at ms[n % len] + (n / len) * period.
//!
//! The link is a FIFO in front of the opportunities. An opportunity serves the packets that have
//! arrived by its time, in order, until its MTU_BYTES are used; a packet larger than what is left
//! takes the rest and continues in the next opportunities, and leaves at the one that carries
//! its last byte (as Mahimahi's LinkQueue). Bytes an opportunity does not carry are lost with it:
//! an opportunity with nothing to carry is wasted. Bytes are the IP packet's (the frame without
//! its 14-byte Ethernet header), as Mahimahi counts the packets of its TUN devices.
//!
//! Departures are computed when a packet is enqueued (as netem computes `rate`): the queue is a
//! FIFO and the trace is fixed, so the time its last byte is carried is known then. Pure: time
//! is passed in, so the clock is unit-tested.

use serde_json::Value;

/// Bytes one delivery opportunity carries (Mahimahi: one MTU-sized packet).
pub const MTU_BYTES: u64 = 1500;
/// The Ethernet header that is not part of the IP packet the trace counts.
pub const ETH_HLEN: usize = 14;
/// Lines a trace may have (the control line carries them as JSON: lab.model.impairment.trace).
pub const MAX_LINES: usize = 2_000_000;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trace {
    /// Milliseconds of each opportunity in one period, non-decreasing.
    pub ms: Vec<u64>,
    /// The last timestamp: the trace repeats after it.
    pub period_ms: u64,
}

impl Trace {
    /// `{"path": "...", "ms": [..]}` (the path is for people; only `ms` is used).
    pub fn from_json(v: &Value) -> Result<Trace, String> {
        let m = v.as_object().ok_or("trace: expected an object {\"path\", \"ms\"}")?;
        for k in m.keys() {
            if k != "path" && k != "ms" {
                return Err(format!("trace: unknown field {k:?}; accepted: path, ms"));
            }
        }
        if let Some(p) = m.get("path") {
            if !p.is_string() {
                return Err(format!("trace.path: expected a string, got {p}"));
            }
        }
        let arr = m.get("ms").and_then(Value::as_array).ok_or("trace.ms: expected an array of milliseconds")?;
        if arr.len() > MAX_LINES {
            return Err(format!("trace.ms: {} opportunities, at most {MAX_LINES}", arr.len()));
        }
        let mut ms = Vec::with_capacity(arr.len());
        for (i, x) in arr.iter().enumerate() {
            let t = x.as_u64().ok_or_else(|| format!("trace.ms[{i}]: expected a whole number of ms >= 0, got {x}"))?;
            if let Some(&prev) = ms.last() {
                if t < prev {
                    return Err(format!("trace.ms[{i}]: {t} is before {prev}: timestamps must not decrease"));
                }
            }
            ms.push(t);
        }
        Trace::new(ms)
    }

    pub fn new(ms: Vec<u64>) -> Result<Trace, String> {
        let period_ms = *ms.last().ok_or("trace.ms: empty; a trace needs at least one opportunity")?;
        if period_ms == 0 {
            return Err("trace.ms: the last timestamp must be > 0 (it is the period the trace repeats with)".into());
        }
        if ms.windows(2).any(|w| w[1] < w[0]) {
            return Err("trace.ms: timestamps must not decrease".into());
        }
        if period_ms > u64::MAX / 1_000_000 / 1024 {
            return Err(format!("trace.ms: last timestamp {period_ms} ms too large"));
        }
        Ok(Trace { ms, period_ms })
    }

    fn len(&self) -> u64 {
        self.ms.len() as u64
    }

    /// Time of opportunity `n` in ns from the start of the trace.
    pub fn time_ns(&self, n: u64) -> u64 {
        let (k, i) = (n / self.len(), (n % self.len()) as usize);
        (self.ms[i] + k * self.period_ms) * 1_000_000
    }

    /// Opportunities at or before `t_ns` from the start (all of them, used or not).
    pub fn count_le(&self, t_ns: u64) -> u64 {
        let t_ms = t_ns / 1_000_000; // opportunities are at whole ms
        let (k, r) = (t_ms / self.period_ms, t_ms % self.period_ms);
        // every opportunity of the k periods before, and those of period k up to r
        k * self.len() + self.ms.partition_point(|&x| x <= r) as u64
    }

    /// Opportunities strictly before `t_ns`: the index of the first one at or after it.
    pub fn count_lt(&self, t_ns: u64) -> u64 {
        if t_ns == 0 {
            0
        } else {
            self.count_le(t_ns - 1)
        }
    }
}

/// What `show` reports of a trace link at a moment: opportunities so far, used and wasted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TraceCounts {
    pub opportunities: u64,
    pub used: u64,
    pub wasted: u64,
}

/// The link's progress through its trace; `start_ns` is when the trace's millisecond 0 is.
#[derive(Debug, Clone)]
pub struct TraceLink {
    pub trace: std::sync::Arc<Trace>,
    pub start_ns: u64,
    /// The opportunity the last packet's last byte used (valid when `any`).
    cur: u64,
    /// Bytes still free in opportunity `cur`.
    left: u64,
    any: bool,
    /// Opportunities that carry (or, for those still ahead, will carry) at least one byte.
    used: u64,
}

impl TraceLink {
    pub fn new(trace: std::sync::Arc<Trace>, start_ns: u64) -> TraceLink {
        TraceLink { trace, start_ns, cur: 0, left: 0, any: false, used: 0 }
    }

    /// The departure time (absolute ns) of a packet of `ip_bytes` arriving at `now` behind every
    /// packet enqueued before it.
    pub fn depart(&mut self, now: u64, ip_bytes: u64) -> u64 {
        let first = self.trace.count_lt(now.saturating_sub(self.start_ns));
        let busy = self.any && (if self.left > 0 { self.cur >= first } else { self.cur + 1 >= first });
        if !busy {
            // idle since before this arrival: what was left of the last opportunity is wasted,
            // and so is every opportunity before `first`
            self.cur = first;
            self.left = MTU_BYTES;
            self.used += 1;
            self.any = true;
        } else if self.left == 0 {
            self.cur += 1;
            self.left = MTU_BYTES;
            self.used += 1;
        }
        let mut rem = ip_bytes.max(1);
        loop {
            let take = rem.min(self.left);
            rem -= take;
            self.left -= take;
            if rem == 0 {
                break;
            }
            self.cur += 1;
            self.left = MTU_BYTES;
            self.used += 1;
        }
        self.start_ns + self.trace.time_ns(self.cur)
    }

    /// Opportunities up to `now`: all of them, those that carried bytes, those wasted. The ones
    /// booked for queued packets but still ahead are not counted yet: they are exactly those
    /// between `now` and `cur` (a busy period books consecutive opportunities, and the current
    /// one began at or before `now`).
    pub fn counts(&self, now: u64) -> TraceCounts {
        let opportunities = self.trace.count_le(now.saturating_sub(self.start_ns));
        let ahead = if self.any && self.cur >= opportunities { self.cur + 1 - opportunities } else { 0 };
        let used = self.used - ahead;
        TraceCounts { opportunities, used, wasted: opportunities - used }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::sync::Arc;

    const MS: u64 = 1_000_000;

    fn link(ms: &[u64]) -> TraceLink {
        TraceLink::new(Arc::new(Trace::new(ms.to_vec()).unwrap()), 0)
    }

    #[test]
    fn rejects_bad_traces() {
        for bad in [
            json!({"ms": []}),
            json!({"ms": [0]}),
            json!({"ms": [3, 2]}),
            json!({"ms": [1, -2]}),
            json!({"ms": [1.5]}),
            json!({"ms": "1 2"}),
            json!({"path": 3, "ms": [1]}),
            json!({"ms": [1], "rate": 3}),
            json!([1, 2]),
        ] {
            assert!(Trace::from_json(&bad).is_err(), "accepted {bad}");
        }
        let t = Trace::from_json(&json!({"path": "x.trace", "ms": [0, 0, 5, 5]})).unwrap();
        assert_eq!(t.period_ms, 5);
    }

    #[test]
    fn opportunity_times_repeat_with_the_last_timestamp() {
        let t = Trace::new(vec![2, 2, 7, 10]).unwrap();
        let times: Vec<u64> = (0..8).map(|n| t.time_ns(n) / MS).collect();
        assert_eq!(times, vec![2, 2, 7, 10, 12, 12, 17, 20]);
        // count_le agrees with the times, at every ms of three periods
        for ms in 0..30 {
            let brute = (0..100).filter(|&n| t.time_ns(n) <= ms * MS).count() as u64;
            assert_eq!(t.count_le(ms * MS + 999_999), brute, "at {ms} ms");
            let lt = (0..100).filter(|&n| t.time_ns(n) < ms * MS).count() as u64;
            assert_eq!(t.count_lt(ms * MS), lt, "before {ms} ms");
        }
    }

    #[test]
    fn a_trace_starting_at_zero_has_two_opportunities_at_each_wrap() {
        // as Mahimahi: the period's last timestamp and the next period's 0 coincide
        let t = Trace::new(vec![0, 4]).unwrap();
        let times: Vec<u64> = (0..6).map(|n| t.time_ns(n) / MS).collect();
        assert_eq!(times, vec![0, 4, 4, 8, 8, 12]);
        assert_eq!(t.count_le(8 * MS), 5);
    }

    #[test]
    fn full_packets_leave_one_per_opportunity() {
        // 1 ms trace: 12 Mbit/s. A burst of five 1500-byte packets at 0.5 ms leaves at 1..5 ms.
        let mut l = link(&[1]);
        let deps: Vec<u64> = (0..5).map(|_| l.depart(MS / 2, 1500) / MS).collect();
        assert_eq!(deps, vec![1, 2, 3, 4, 5]);
        assert_eq!(l.counts(3 * MS), TraceCounts { opportunities: 3, used: 3, wasted: 0 });
        assert_eq!(l.counts(10 * MS), TraceCounts { opportunities: 10, used: 5, wasted: 5 });
    }

    #[test]
    fn an_opportunity_at_the_arrival_time_is_usable() {
        let mut l = link(&[1]);
        assert_eq!(l.depart(2 * MS, 100), 2 * MS);
        assert_eq!(l.depart(2 * MS + 1, 100), 3 * MS);
    }

    #[test]
    fn small_packets_share_an_opportunity_and_big_ones_span_two() {
        let mut l = link(&[10]);
        // three 500-byte packets fill the opportunity at 10 ms exactly
        assert_eq!([l.depart(0, 500), l.depart(0, 500), l.depart(0, 500)], [10 * MS; 3]);
        // 1000 + 1000: the second takes 500 of 20 ms's and 500 of 30 ms's
        assert_eq!(l.depart(0, 1000), 20 * MS);
        assert_eq!(l.depart(0, 1000), 30 * MS);
        // 1000 left at 30 ms: a 900-byte packet still fits in it
        assert_eq!(l.depart(0, 900), 30 * MS);
        // a 4000-byte frame (jumbo / unsplit) spans 40, 50, 60 (100 left at 30 ms used too)
        assert_eq!(l.depart(0, 4000), 60 * MS);
        assert_eq!(l.counts(60 * MS), TraceCounts { opportunities: 6, used: 6, wasted: 0 });
    }

    #[test]
    fn leftover_bytes_of_a_past_opportunity_are_wasted() {
        let mut l = link(&[10]);
        assert_eq!(l.depart(0, 100), 10 * MS);
        // arrives after 10 ms: the 1400 bytes left then are gone; 20 ms is the next
        assert_eq!(l.depart(11 * MS, 100), 20 * MS);
        // arrives at 35 ms: 30 ms was wasted
        assert_eq!(l.depart(35 * MS, 1500), 40 * MS);
        assert_eq!(l.counts(45 * MS), TraceCounts { opportunities: 4, used: 3, wasted: 1 });
    }

    #[test]
    fn counts_exclude_opportunities_booked_ahead() {
        let mut l = link(&[1]);
        for _ in 0..10 {
            l.depart(0, 1500); // booked 1..10 ms
        }
        assert_eq!(l.counts(0), TraceCounts { opportunities: 0, used: 0, wasted: 0 });
        assert_eq!(l.counts(4 * MS), TraceCounts { opportunities: 4, used: 4, wasted: 0 });
        assert_eq!(l.counts(20 * MS), TraceCounts { opportunities: 20, used: 10, wasted: 10 });
    }

    #[test]
    fn delivered_bytes_never_exceed_the_opportunities() {
        // random sizes and arrivals over a bursty trace: at every departure, the bytes gone by
        // then fit in the opportunities by then, and the counts add up
        let t = Arc::new(Trace::new(vec![1, 1, 1, 4, 9, 9, 15, 30]).unwrap());
        let mut l = TraceLink::new(t.clone(), 5 * MS);
        let mut x: u64 = 12345;
        let mut now = 5 * MS;
        let mut deps = vec![];
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            now += x % (2 * MS);
            let size = 40 + x % 1461;
            deps.push((l.depart(now, size), size));
        }
        assert!(deps.windows(2).all(|w| w[0].0 <= w[1].0), "FIFO order");
        let mut gone = 0;
        for &(d, size) in &deps {
            gone += size;
            let opp = t.count_le(d - 5 * MS);
            assert!(gone <= opp * MTU_BYTES, "{gone} bytes by {d} > {opp} opportunities");
            let c = l.counts(d);
            assert_eq!(c.used + c.wasted, c.opportunities);
        }
        let c = l.counts(deps.last().unwrap().0); // everything enqueued has left
        assert_eq!(c.used, l.used);
        assert!(gone <= c.used * MTU_BYTES && gone >= c.used, "{c:?} {gone}");
    }
}
