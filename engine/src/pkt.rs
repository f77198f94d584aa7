//! AF_PACKET sockets bound to one interface with PACKET_VNET_HDR, and batched I/O with
//! recvmmsg/sendmmsg. Each received buffer starts with a 10-byte virtio_net_hdr so GSO
//! super-frames and CHECKSUM_PARTIAL frames pass through intact (packet(7)).

use crate::csum::VNET_HDR_LEN;
use std::ffi::CString;
use std::io;
use std::mem::{size_of, zeroed};
use std::os::fd::RawFd;

/// Room for the vnet header plus a 64 KiB GSO frame and its headers.
pub const BUF_SIZE: usize = VNET_HDR_LEN + 65536 + 1024;
pub const RX_BATCH: usize = 64;
pub const TX_BATCH: usize = 64;

const PACKET_IGNORE_OUTGOING: libc::c_int = 23;
const PACKET_OUTGOING: u8 = 4;

pub struct PacketSocket {
    pub fd: RawFd,
    pub ifindex: i32,
    pub name: String,
}

fn errno_msg(what: &str) -> String {
    format!("{what}: {}", io::Error::last_os_error())
}

fn setopt(fd: RawFd, level: i32, opt: i32, val: libc::c_int) -> io::Result<()> {
    let r = unsafe {
        libc::setsockopt(fd, level, opt, &val as *const _ as *const libc::c_void, size_of::<libc::c_int>() as u32)
    };
    if r < 0 { Err(io::Error::last_os_error()) } else { Ok(()) }
}

impl PacketSocket {
    /// Open, configure and bind a packet socket on `name` (promiscuous, vnet header, own sends
    /// not looped back). Errors name the interface.
    pub fn open(name: &str) -> Result<PacketSocket, String> {
        let cname = CString::new(name).map_err(|_| format!("bad interface name {name:?}"))?;
        let ifindex = unsafe { libc::if_nametoindex(cname.as_ptr()) } as i32;
        if ifindex == 0 {
            return Err(format!("interface {name:?} not found in this network namespace"));
        }
        // Protocol 0 at creation so nothing is queued before bind() restricts the interface.
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(errno_msg("socket(AF_PACKET)"));
        }
        let s = PacketSocket { fd, ifindex, name: name.to_string() };
        setopt(fd, libc::SOL_PACKET, libc::PACKET_VNET_HDR, 1).map_err(|e| format!("{name}: PACKET_VNET_HDR: {e}"))?;
        // Kernel >= 4.20: never deliver frames this host sends on the interface (including our
        // own re-injections). Older kernels: filtered by sll_pkttype in recv.
        let _ = setopt(fd, libc::SOL_PACKET, PACKET_IGNORE_OUTGOING, 1);
        for (opt, size) in [(libc::SO_RCVBUFFORCE, 32 << 20), (libc::SO_SNDBUFFORCE, 8 << 20)] {
            if setopt(fd, libc::SOL_SOCKET, opt, size).is_err() {
                let plain = if opt == libc::SO_RCVBUFFORCE { libc::SO_RCVBUF } else { libc::SO_SNDBUF };
                let _ = setopt(fd, libc::SOL_SOCKET, plain, size);
            }
        }
        let mut sll: libc::sockaddr_ll = unsafe { zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = (libc::ETH_P_ALL as u16).to_be();
        sll.sll_ifindex = ifindex;
        let r = unsafe { libc::bind(fd, &sll as *const _ as *const libc::sockaddr, size_of::<libc::sockaddr_ll>() as u32) };
        if r < 0 {
            return Err(errno_msg(&format!("bind to {name}")));
        }
        // Kernel receive timestamps: a frame's delay counts from its arrival even when the
        // forwarding thread reads it later (receive coalescing in fwd.rs).
        let _ = setopt(fd, libc::SOL_SOCKET, libc::SO_TIMESTAMPNS, 1);
        let mut mreq: libc::packet_mreq = unsafe { zeroed() };
        mreq.mr_ifindex = ifindex;
        mreq.mr_type = libc::PACKET_MR_PROMISC as u16;
        let r = unsafe {
            libc::setsockopt(fd, libc::SOL_PACKET, libc::PACKET_ADD_MEMBERSHIP, &mreq as *const _ as *const libc::c_void, size_of::<libc::packet_mreq>() as u32)
        };
        if r < 0 {
            return Err(errno_msg(&format!("{name}: promiscuous mode")));
        }
        Ok(s)
    }

    /// (packets, drops) since the previous call (PACKET_STATISTICS resets on read).
    pub fn take_stats(&self) -> (u64, u64) {
        let mut st: libc::tpacket_stats = unsafe { zeroed() };
        let mut len = size_of::<libc::tpacket_stats>() as u32;
        let r = unsafe { libc::getsockopt(self.fd, libc::SOL_PACKET, libc::PACKET_STATISTICS, &mut st as *mut _ as *mut libc::c_void, &mut len) };
        if r < 0 { (0, 0) } else { (st.tp_packets as u64, st.tp_drops as u64) }
    }
}

impl Drop for PacketSocket {
    fn drop(&mut self) {
        unsafe { libc::close(self.fd) };
    }
}

/// Receive buffers for one recvmmsg() call.
pub struct RxBatch {
    pub bufs: Vec<Vec<u8>>,
    iovs: Vec<libc::iovec>,
    addrs: Vec<libc::sockaddr_ll>,
    hdrs: Vec<libc::mmsghdr>,
    cmsgs: Vec<[u64; 8]>,
    /// Length of each received buffer (vnet header included); 0 = skip (outgoing/truncated).
    pub lens: Vec<usize>,
    /// Kernel receive time of each frame (CLOCK_REALTIME ns, SO_TIMESTAMPNS), 0 if absent.
    pub stamps: Vec<u64>,
    pub truncated: u64,
}

// The raw pointers in iovs/hdrs point into bufs/addrs, which are never reallocated.
unsafe impl Send for RxBatch {}

impl RxBatch {
    pub fn new() -> RxBatch {
        let mut bufs: Vec<Vec<u8>> = (0..RX_BATCH).map(|_| vec![0u8; BUF_SIZE]).collect();
        let mut addrs: Vec<libc::sockaddr_ll> = vec![unsafe { zeroed() }; RX_BATCH];
        let mut iovs: Vec<libc::iovec> = bufs
            .iter_mut()
            .map(|b| libc::iovec { iov_base: b.as_mut_ptr() as *mut libc::c_void, iov_len: b.len() })
            .collect();
        let mut hdrs: Vec<libc::mmsghdr> = vec![unsafe { zeroed() }; RX_BATCH];
        let cmsgs = vec![[0u64; 8]; RX_BATCH];
        for i in 0..RX_BATCH {
            hdrs[i].msg_hdr.msg_iov = &mut iovs[i];
            hdrs[i].msg_hdr.msg_iovlen = 1;
            hdrs[i].msg_hdr.msg_name = &mut addrs[i] as *mut _ as *mut libc::c_void;
        }
        let mut b = RxBatch { bufs, iovs, addrs, hdrs, cmsgs, lens: vec![0; RX_BATCH], stamps: vec![0; RX_BATCH], truncated: 0 };
        for i in 0..RX_BATCH {
            b.hdrs[i].msg_hdr.msg_control = b.cmsgs[i].as_mut_ptr() as *mut libc::c_void;
        }
        b
    }

    /// Non-blocking receive of up to RX_BATCH frames; returns how many slots were filled.
    pub fn recv(&mut self, fd: RawFd) -> io::Result<usize> {
        for i in 0..RX_BATCH {
            self.hdrs[i].msg_hdr.msg_namelen = size_of::<libc::sockaddr_ll>() as u32;
            self.hdrs[i].msg_hdr.msg_flags = 0;
            self.hdrs[i].msg_hdr.msg_controllen = size_of::<[u64; 8]>();
            self.iovs[i].iov_len = BUF_SIZE;
        }
        let n = unsafe { libc::recvmmsg(fd, self.hdrs.as_mut_ptr(), RX_BATCH as u32, libc::MSG_DONTWAIT, std::ptr::null_mut()) };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.raw_os_error() {
                Some(libc::EAGAIN) | Some(libc::EINTR) => Ok(0),
                _ => Err(e),
            };
        }
        let n = n as usize;
        for i in 0..n {
            let len = self.hdrs[i].msg_len as usize;
            let trunc = self.hdrs[i].msg_hdr.msg_flags & libc::MSG_TRUNC != 0;
            if trunc {
                self.truncated += 1;
            }
            self.stamps[i] = 0;
            unsafe {
                let h = &self.hdrs[i].msg_hdr;
                let mut c = libc::CMSG_FIRSTHDR(h);
                while !c.is_null() {
                    if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_TIMESTAMPNS {
                        let ts: libc::timespec = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::timespec);
                        self.stamps[i] = ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64;
                    }
                    c = libc::CMSG_NXTHDR(h, c);
                }
            }
            self.lens[i] = if self.addrs[i].sll_pkttype == PACKET_OUTGOING || trunc || len <= VNET_HDR_LEN { 0 } else { len };
        }
        Ok(n)
    }
}

/// Send `hdrs` (already pointing at the frames) with sendmmsg, retrying on a full send buffer.
/// Returns (sent, failed). A frame the kernel rejects (EMSGSIZE, EINVAL) is skipped and counted.
pub fn send_all(fd: RawFd, hdrs: &mut [libc::mmsghdr]) -> (usize, usize) {
    let n = hdrs.len();
    let (mut i, mut failed, mut retries) = (0usize, 0usize, 0u32);
    while i < n {
        let r = unsafe { libc::sendmmsg(fd, hdrs[i..].as_mut_ptr(), (n - i) as u32, 0) };
        if r > 0 {
            i += r as usize;
            continue;
        }
        let err = io::Error::last_os_error().raw_os_error().unwrap_or(0);
        match err {
            libc::EINTR => {}
            libc::EAGAIN | libc::ENOBUFS if retries < 1000 => {
                retries += 1;
                let mut p = libc::pollfd { fd, events: libc::POLLOUT, revents: 0 };
                unsafe { libc::poll(&mut p, 1, 1) };
            }
            _ => {
                failed += 1;
                i += 1;
            }
        }
    }
    (n - failed, failed)
}

/// A batch of owned frames waiting for one sendmmsg().
pub struct TxBatch {
    pub frames: Vec<Vec<u8>>,
    iovs: Vec<libc::iovec>,
    hdrs: Vec<libc::mmsghdr>,
}

unsafe impl Send for TxBatch {}

impl TxBatch {
    pub fn new() -> TxBatch {
        TxBatch {
            frames: Vec::with_capacity(TX_BATCH),
            iovs: vec![libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; TX_BATCH],
            hdrs: vec![unsafe { zeroed() }; TX_BATCH],
        }
    }

    pub fn is_full(&self) -> bool {
        self.frames.len() >= TX_BATCH
    }

    /// Send every frame; returns (sent, failed, bytes sent excluding vnet headers). The frames
    /// are left in `self.frames` for the caller to recycle.
    pub fn flush(&mut self, fd: RawFd) -> (usize, usize, u64) {
        let n = self.frames.len();
        if n == 0 {
            return (0, 0, 0);
        }
        let mut bytes = 0u64;
        for i in 0..n {
            let f = &mut self.frames[i];
            bytes += (f.len() - VNET_HDR_LEN) as u64;
            self.iovs[i] = libc::iovec { iov_base: f.as_mut_ptr() as *mut libc::c_void, iov_len: f.len() };
            self.hdrs[i] = unsafe { zeroed() };
            self.hdrs[i].msg_hdr.msg_iov = &mut self.iovs[i];
            self.hdrs[i].msg_hdr.msg_iovlen = 1;
        }
        let (sent, failed) = send_all(fd, &mut self.hdrs[..n]);
        (sent, failed, if failed == 0 { bytes } else { bytes * sent as u64 / n as u64 })
    }
}

/// Forward the received batch as is (fast path, zero copy). Returns (sent, failed, bytes).
pub fn forward_rx(fd: RawFd, rx: &mut RxBatch, n: usize, scratch: &mut Vec<libc::mmsghdr>, iovs: &mut Vec<libc::iovec>) -> (usize, usize, u64) {
    scratch.clear();
    iovs.clear();
    let mut bytes = 0u64;
    for i in 0..n {
        let len = rx.lens[i];
        if len == 0 {
            continue;
        }
        bytes += (len - VNET_HDR_LEN) as u64;
        iovs.push(libc::iovec { iov_base: rx.bufs[i].as_mut_ptr() as *mut libc::c_void, iov_len: len });
    }
    for iov in iovs.iter_mut() {
        let mut h: libc::mmsghdr = unsafe { zeroed() };
        h.msg_hdr.msg_iov = iov;
        h.msg_hdr.msg_iovlen = 1;
        scratch.push(h);
    }
    let m = scratch.len();
    if m == 0 {
        return (0, 0, 0);
    }
    let (sent, failed) = send_all(fd, scratch);
    (sent, failed, if failed == 0 { bytes } else { bytes * sent as u64 / m as u64 })
}
