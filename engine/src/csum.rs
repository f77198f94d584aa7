//! virtio_net_hdr handling: completing a partial checksum in software (netem corrupts only after
//! skb_checksum_help(), otherwise the receiver would recompute a valid checksum over the
//! corrupted bytes), flipping a bit, and segmenting a GSO super-frame (TCP/UDP over IPv4/IPv6)
//! into MTU-sized frames when one of them must be corrupted (as netem_segment() does).

use crate::rng::Rng;

pub const VNET_HDR_LEN: usize = 10;
pub const F_NEEDS_CSUM: u8 = 1;
pub const GSO_NONE: u8 = 0;
pub const GSO_TCPV4: u8 = 1;
pub const GSO_UDP: u8 = 3;
pub const GSO_TCPV6: u8 = 4;
pub const GSO_UDP_L4: u8 = 5;
pub const GSO_ECN: u8 = 0x80;

/// struct virtio_net_hdr, little-endian (packet sockets use the host's order, x86/arm LE).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VnetHdr {
    pub flags: u8,
    pub gso_type: u8,
    pub hdr_len: u16,
    pub gso_size: u16,
    pub csum_start: u16,
    pub csum_offset: u16,
}

impl VnetHdr {
    pub fn parse(b: &[u8]) -> VnetHdr {
        let u = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        VnetHdr { flags: b[0], gso_type: b[1], hdr_len: u(2), gso_size: u(4), csum_start: u(6), csum_offset: u(8) }
    }
    pub fn write(&self, b: &mut [u8]) {
        b[0] = self.flags;
        b[1] = self.gso_type;
        b[2..4].copy_from_slice(&self.hdr_len.to_le_bytes());
        b[4..6].copy_from_slice(&self.gso_size.to_le_bytes());
        b[6..8].copy_from_slice(&self.csum_start.to_le_bytes());
        b[8..10].copy_from_slice(&self.csum_offset.to_le_bytes());
    }
    pub fn is_gso(&self) -> bool {
        self.gso_type & !GSO_ECN != GSO_NONE
    }
}

/// One's-complement sum of `data` added to `acc` (not folded).
pub fn sum16(data: &[u8], mut acc: u64) -> u64 {
    let mut chunks = data.chunks_exact(2);
    for c in &mut chunks {
        acc += u16::from_be_bytes([c[0], c[1]]) as u64;
    }
    if let [last] = chunks.remainder() {
        acc += (*last as u64) << 8;
    }
    acc
}

pub fn fold(mut acc: u64) -> u16 {
    while acc >> 16 != 0 {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc as u16
}

/// Complete a CHECKSUM_PARTIAL frame (VIRTIO_NET_HDR_F_NEEDS_CSUM): the field at
/// csum_start + csum_offset holds the pseudo-header sum; store the final checksum there and clear
/// the flag (skb_checksum_help()). `buf` = vnet header + frame. Returns false if malformed.
pub fn complete_checksum(buf: &mut [u8]) -> bool {
    let mut h = VnetHdr::parse(buf);
    if h.flags & F_NEEDS_CSUM == 0 {
        return true;
    }
    let frame = &mut buf[VNET_HDR_LEN..];
    let start = h.csum_start as usize;
    let field = start + h.csum_offset as usize;
    if field + 2 > frame.len() {
        return false;
    }
    let c = !fold(sum16(&frame[start..], 0));
    // A computed 0 is sent as 0xffff (CSUM_MANGLED_0), which matters for UDP.
    let c = if c == 0 { 0xffff } else { c };
    frame[field..field + 2].copy_from_slice(&c.to_be_bytes());
    h.flags &= !F_NEEDS_CSUM;
    h.write(buf);
    true
}

/// Flip one random bit of one random byte of the frame (netem's corruption).
pub fn flip_random_bit(buf: &mut [u8], rng: &mut Rng) {
    let frame = &mut buf[VNET_HDR_LEN..];
    if frame.is_empty() {
        return;
    }
    let i = rng.below(frame.len() as u32) as usize;
    frame[i] ^= 1 << rng.below(8);
}

/// Split a GSO frame (`buf` = vnet header + frame) into wire-sized frames (gso_size of payload
/// each, as the NIC or the kernel's software GSO would put them on the wire). Supports
/// TCPv4/TCPv6 (TSO) and UDP_L4 (USO); None otherwise.
///
/// `complete`: every segment gets its final L4 checksum and a zero vnet header (needed before a
/// bit is flipped). Otherwise each segment stays CHECKSUM_PARTIAL (the pseudo-header sum in the
/// checksum field, VIRTIO_NET_HDR_F_NEEDS_CSUM in its vnet header), which is what the kernel hands
/// a checksum-offloading device and saves summing every payload byte in the engine.
pub fn segment(buf: &[u8], complete: bool) -> Option<Vec<Vec<u8>>> {
    let h = VnetHdr::parse(buf);
    let frame = &buf[VNET_HDR_LEN..];
    let gso = h.gso_type & !GSO_ECN;
    let mss = h.gso_size as usize;
    if mss == 0 || !matches!(gso, GSO_TCPV4 | GSO_TCPV6 | GSO_UDP_L4) {
        return None;
    }
    // L3 offset after Ethernet (+ one 802.1Q tag).
    let mut l3 = 14;
    let mut ethertype = u16::from_be_bytes([*frame.get(12)?, *frame.get(13)?]);
    if ethertype == 0x8100 || ethertype == 0x88a8 {
        ethertype = u16::from_be_bytes([*frame.get(16)?, *frame.get(17)?]);
        l3 = 18;
    }
    let v4 = match ethertype {
        0x0800 => true,
        0x86dd => false,
        _ => return None,
    };
    let l4 = h.csum_start as usize;
    let tcp = gso != GSO_UDP_L4;
    let l4_hdr = if tcp { ((*frame.get(l4 + 12)? >> 4) as usize) * 4 } else { 8 };
    let hdrs = l4 + l4_hdr;
    if hdrs > frame.len() || l4 <= l3 {
        return None;
    }
    let payload = &frame[hdrs..];
    let nseg = payload.len().div_ceil(mss).max(1);
    let seq0 = if tcp { u32::from_be_bytes(frame[l4 + 4..l4 + 8].try_into().ok()?) } else { 0 };
    let id0 = if v4 { u16::from_be_bytes([frame[l3 + 4], frame[l3 + 5]]) } else { 0 };
    let proto: u8 = if tcp { 6 } else { 17 };
    let mut out = Vec::with_capacity(nseg);
    for (i, chunk) in payload.chunks(mss).enumerate() {
        let mut seg = vec![0u8; VNET_HDR_LEN + hdrs + chunk.len()];
        let f = &mut seg[VNET_HDR_LEN..];
        f[..hdrs].copy_from_slice(&frame[..hdrs]);
        f[hdrs..].copy_from_slice(chunk);
        let flen = f.len();
        if v4 {
            f[l3 + 2..l3 + 4].copy_from_slice(&((flen - l3) as u16).to_be_bytes());
            f[l3 + 4..l3 + 6].copy_from_slice(&id0.wrapping_add(i as u16).to_be_bytes());
            f[l3 + 10..l3 + 12].copy_from_slice(&[0, 0]);
            let ihl = ((f[l3] & 0x0f) as usize) * 4;
            let c = !fold(sum16(&f[l3..l3 + ihl], 0));
            f[l3 + 10..l3 + 12].copy_from_slice(&c.to_be_bytes());
        } else {
            f[l3 + 4..l3 + 6].copy_from_slice(&((flen - l3 - 40) as u16).to_be_bytes());
        }
        let l4len = flen - l4;
        let csum_field;
        if tcp {
            let seq = seq0.wrapping_add((i * mss) as u32);
            f[l4 + 4..l4 + 8].copy_from_slice(&seq.to_be_bytes());
            let last = i + 1 == nseg;
            if !last {
                f[l4 + 13] &= !(0x01 | 0x08); // FIN, PSH only on the last segment
            }
            if i != 0 {
                f[l4 + 13] &= !0x80; // CWR only on the first
            }
            csum_field = l4 + 16;
        } else {
            f[l4 + 4..l4 + 6].copy_from_slice(&(l4len as u16).to_be_bytes());
            csum_field = l4 + 6;
        }
        f[csum_field..csum_field + 2].copy_from_slice(&[0, 0]);
        let mut acc = if v4 { sum16(&f[l3 + 12..l3 + 20], 0) } else { sum16(&f[l3 + 8..l3 + 40], 0) };
        acc += proto as u64 + l4len as u64;
        if complete {
            let c = !fold(sum16(&f[l4..], acc));
            let c = if c == 0 && !tcp { 0xffff } else { c };
            f[csum_field..csum_field + 2].copy_from_slice(&c.to_be_bytes());
        } else {
            f[csum_field..csum_field + 2].copy_from_slice(&fold(acc).to_be_bytes());
            let vh = VnetHdr {
                flags: F_NEEDS_CSUM,
                gso_type: GSO_NONE,
                hdr_len: hdrs as u16,
                gso_size: 0,
                csum_start: l4 as u16,
                csum_offset: (csum_field - l4) as u16,
            };
            vh.write(&mut seg[..VNET_HDR_LEN]);
        }
        out.push(seg);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// vnet hdr + Ethernet + IPv4 + TCP with a partial checksum, payload `n` bytes.
    fn tcp4_frame(n: usize, gso_size: u16) -> Vec<u8> {
        let mut f = vec![0u8; 14 + 20 + 20 + n];
        f[12] = 0x08;
        f[14] = 0x45;
        let tot = (20 + 20 + n) as u16;
        f[16..18].copy_from_slice(&tot.to_be_bytes());
        f[18..20].copy_from_slice(&7u16.to_be_bytes());
        f[22] = 64;
        f[23] = 6;
        f[26..30].copy_from_slice(&[10, 0, 0, 1]);
        f[30..34].copy_from_slice(&[10, 0, 0, 2]);
        let c = !fold(sum16(&f[14..34], 0));
        f[24..26].copy_from_slice(&c.to_be_bytes());
        f[34..36].copy_from_slice(&1234u16.to_be_bytes());
        f[36..38].copy_from_slice(&80u16.to_be_bytes());
        f[38..42].copy_from_slice(&1000u32.to_be_bytes());
        f[46] = 5 << 4;
        f[47] = 0x18 | 0x01; // PSH ACK FIN
        for (i, b) in f[54..].iter_mut().enumerate() {
            *b = (i * 7) as u8;
        }
        // pseudo-header sum (not inverted) in the checksum field, as the stack leaves it
        let ps = fold(sum16(&f[26..34], 6 + (20 + n) as u64));
        f[50..52].copy_from_slice(&ps.to_be_bytes());
        let h = VnetHdr {
            flags: F_NEEDS_CSUM,
            gso_type: if gso_size > 0 { GSO_TCPV4 } else { GSO_NONE },
            hdr_len: 54,
            gso_size,
            csum_start: 34,
            csum_offset: 16,
        };
        let mut buf = vec![0u8; VNET_HDR_LEN];
        h.write(&mut buf);
        buf.extend_from_slice(&f);
        buf
    }

    fn tcp_ok(f: &[u8]) -> bool {
        let l4len = f.len() - 34;
        let acc = sum16(&f[26..34], 6 + l4len as u64);
        fold(sum16(&f[34..], acc)) == 0xffff
    }

    #[test]
    fn completes_partial_checksum() {
        let mut b = tcp4_frame(101, 0);
        assert!(!tcp_ok(&b[VNET_HDR_LEN..]));
        assert!(complete_checksum(&mut b));
        assert!(tcp_ok(&b[VNET_HDR_LEN..]));
        assert_eq!(VnetHdr::parse(&b).flags & F_NEEDS_CSUM, 0);
        let before = b.clone();
        let mut r = Rng::new(1);
        flip_random_bit(&mut b, &mut r);
        let diff: u32 = before.iter().zip(&b).map(|(x, y)| (x ^ y).count_ones()).sum();
        assert_eq!(diff, 1);
        assert_eq!(before[..VNET_HDR_LEN], b[..VNET_HDR_LEN]);
    }

    #[test]
    fn segments_tso_frame() {
        let b = tcp4_frame(3000, 1400);
        let segs = segment(&b, true).unwrap();
        assert_eq!(segs.len(), 3);
        let mut seq = 1000u32;
        for (i, s) in segs.iter().enumerate() {
            let f = &s[VNET_HDR_LEN..];
            assert!(tcp_ok(f), "segment {i} checksum");
            assert_eq!(fold(sum16(&f[14..34], 0)), 0xffff, "ip checksum {i}");
            assert_eq!(u32::from_be_bytes(f[38..42].try_into().unwrap()), seq);
            assert_eq!(u16::from_be_bytes([f[16], f[17]]) as usize, f.len() - 14);
            seq += (f.len() - 54) as u32;
            let fin = f[47] & 0x01 != 0;
            assert_eq!(fin, i == 2);
        }
        assert_eq!(seq, 4000);
    }

    #[test]
    fn segments_tso_frame_with_partial_checksums() {
        let b = tcp4_frame(3000, 1400);
        let full = segment(&b, true).unwrap();
        let part = segment(&b, false).unwrap();
        assert_eq!(part.len(), 3);
        for (i, (p, f)) in part.iter().zip(&full).enumerate() {
            let h = VnetHdr::parse(p);
            assert_eq!((h.flags, h.gso_type, h.csum_start, h.csum_offset), (F_NEEDS_CSUM, GSO_NONE, 34, 16), "segment {i}");
            assert!(!h.is_gso());
            // Completing the partial checksum gives exactly the fully computed segment.
            let mut done = p.clone();
            assert!(complete_checksum(&mut done));
            assert_eq!(done[VNET_HDR_LEN..], f[VNET_HDR_LEN..], "segment {i}");
        }
    }
}
