//! Host and process plumbing: host identity, addresses, per-process runtimes, liveness of peers.

#[allow(unused_imports)]
use super::*;

/// This host's identity: machines differ by boot id, network namespaces by their inode.
pub fn host_key() -> String {
    let boot = crate::io::read_bounded(std::path::Path::new("/proc/sys/kernel/random/boot_id"), 4096).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default();
    let net = crate::io::read_link(std::path::Path::new("/proc/self/ns/net")).map(|p| p.to_string_lossy().into_owned()).unwrap_or_default();
    format!("{}/{net}", boot.trim())
}

/// The first non-loopback IPv4 address of this host (network namespace), if any.
pub(super) fn first_ipv4() -> Option<String> {
    let mut addrs: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `addrs` with a list we free below; on failure it is untouched.
    if unsafe { libc::getifaddrs(&mut addrs) } != 0 {
        return None;
    }
    let mut found = None;
    let mut cur = addrs;
    while !cur.is_null() && found.is_none() {
        // SAFETY: `cur` is a node of the list getifaddrs returned (not yet freed).
        let ifa = unsafe { &*cur };
        if !ifa.ifa_addr.is_null() {
            // SAFETY: a non-null ifa_addr points at a sockaddr whose family says its type.
            let family = unsafe { (*ifa.ifa_addr).sa_family } as i32;
            if family == libc::AF_INET {
                // SAFETY: AF_INET addresses are sockaddr_in.
                let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                let ip = std::net::Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
                if !ip.is_loopback() {
                    found = Some(ip.to_string());
                }
            }
        }
        cur = ifa.ifa_next;
    }
    // SAFETY: `addrs` came from getifaddrs and is freed once.
    unsafe { libc::freeifaddrs(addrs) };
    found
}

/// A tokio runtime owned by one process, without threads of its own: a reader's requests
/// and their connections make progress while the thread waiting for them drives it
/// ([`Rt::drive`]), so a request costs no hand-off to a runtime thread and back. A forked
/// child that inherits it never touches it (its connections belong to the parent); it leaks
/// it instead of shutting down what the parent owns.
pub(super) struct Rt {
    pub(super) rt: Option<tokio::runtime::Runtime>,
    pub(super) pid: u32,
}

impl Rt {
    pub(super) fn new(name: &str) -> Result<Rt> {
        let rt = crate::io::runtime::build_current(name)?;
        Ok(Rt { rt: Some(rt), pid: std::process::id() })
    }

    pub(super) fn handle(&self) -> Result<&tokio::runtime::Runtime> {
        match &self.rt {
            Some(rt) if self.pid == std::process::id() => Ok(rt),
            _ => Err(Error::invalid(
                "store",
                "this distributed store belongs to the parent process; call fork_reader() in the forked worker".to_string(),
            )),
        }
    }

    /// Run `f` with the runtime from the calling thread (also inside another runtime).
    pub(super) fn drive<F>(&self, f: F) -> Result<F::Output>
    where
        F: std::future::Future + Send,
        F::Output: Send,
    {
        Ok(crate::io::runtime::drive(self.handle()?, f))
    }
}

impl Drop for Rt {
    fn drop(&mut self) {
        if let Some(rt) = self.rt.take() {
            if self.pid == std::process::id() {
                rt.shutdown_background();
            } else {
                std::mem::forget(rt);
            }
        }
    }
}

/// Whether a process on this host has exited (a pidfd polls readable once it has, zombie or
/// not; without pidfd support, `kill(pid, 0)`).
pub(super) struct Liveness {
    pub(super) pid: u32,
    pub(super) pidfd: Option<std::os::fd::OwnedFd>,
}

impl Liveness {
    pub(super) fn new(pid: u32) -> Liveness {
        use std::os::fd::FromRawFd;
        // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) } as i32;
        // SAFETY: a non-negative return is a fresh descriptor nobody else owns.
        let pidfd = (fd >= 0).then(|| unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) });
        Liveness { pid, pidfd }
    }

    pub(super) fn exited(&self) -> bool {
        use std::os::fd::AsRawFd;
        match &self.pidfd {
            Some(fd) => {
                let mut p = libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
                // SAFETY: one valid pollfd, zero timeout.
                unsafe { libc::poll(&mut p, 1, 0) > 0 }
            }
            // SAFETY: signal 0 only checks that the process exists.
            None => (unsafe { libc::kill(self.pid as libc::pid_t, 0) }) != 0,
        }
    }
}
