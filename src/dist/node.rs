//! A rank of a distributed store ([`DistNode`]: its shards, its Flight server, its reader) and
//! the read side any process can hold ([`DistReader`]: connections to every rank, the
//! variables' shard tables, one [`DistSource`] per variable).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use arrow_array::Array;
use arrow_flight::flight_service_client::FlightServiceClient;
use arrow_flight::Ticket;
use futures::TryStreamExt;
use serde::{Deserialize, Serialize};
use tonic::transport::Channel;

use crate::dist::comm::{check_ns, write_atomic};
use crate::dist::flight::{self, Received, Served, ShardService, Shards};
use crate::dist::shard::SharedRows;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::memory::{Allocator, RaggedBatch, Tensor, TensorView};
use crate::store::{Batch, Ids, Layout, Logical, ReadOptions, RecordSource, Store};

/// Where a rank serves: its Flight address, its host identity and its process.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Endpoint {
    /// The rank.
    pub rank: usize,
    /// `host:port` of its Flight server.
    pub addr: String,
    /// Host identity: boot id and network namespace (ranks that share it share memory).
    pub host: String,
    /// Process id.
    pub pid: u32,
}

/// One rank's shard of a variable, as every reader sees it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ShardMeta {
    /// Owning rank.
    pub rank: usize,
    /// Rows in the shard.
    pub rows: u64,
    /// Element type name.
    pub dtype: String,
    /// Record shape (dense shards).
    pub item_shape: Option<Vec<usize>>,
    /// Record dimensions (ragged shards).
    pub ndim: Option<usize>,
    /// What the records mean.
    pub logical: String,
    /// The owner's memfd of shared rows (readers on its host map it).
    pub fd: Option<i32>,
    /// The store folder the owner serves (readers on its host open it).
    pub store: Option<String>,
}

impl ShardMeta {
    fn layout(&self) -> Result<Layout> {
        match (&self.item_shape, self.ndim) {
            (Some(s), None) => Ok(Layout::Dense { item_shape: s.clone() }),
            (None, Some(nd)) if nd >= 1 => Ok(Layout::Ragged { ndim: nd }),
            _ => Err(Error::invalid("shard", format!("rank {} describes neither dense nor ragged records", self.rank))),
        }
    }
}

/// How readers reach other ranks' shards.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// Shared memory (or the store's files) with ranks on the same host, Flight otherwise.
    Auto,
    /// Arrow Flight to every other rank.
    Flight,
    /// Shared memory only: every rank must be on this host.
    Shm,
}

impl std::str::FromStr for Transport {
    type Err = Error;
    fn from_str(s: &str) -> Result<Transport> {
        match s {
            "auto" => Ok(Transport::Auto),
            "flight" => Ok(Transport::Flight),
            "shm" => Ok(Transport::Shm),
            _ => Err(Error::invalid("transport", format!("'{s}'; expected auto, flight or shm"))),
        }
    }
}

/// Settings of a distributed store.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct DistOptions {
    /// Longest wait for a peer's answer (seconds) before a [`Error::Peer`] naming it.
    pub timeout_s: f64,
    /// How other ranks are reached.
    pub transport: Transport,
    /// Address other hosts reach this rank at (default: `ZRECORD_DIST_HOST`, else the first
    /// non-loopback IPv4 address, else 127.0.0.1).
    pub host: Option<String>,
    /// Rendezvous folder and namespace: ranks publish their endpoint and shards there, so
    /// extra members can join and a restarted rank can be found again.
    pub rendezvous: Option<(PathBuf, String)>,
    /// Largest answer asked of one peer in one request (bigger batches are split).
    pub max_request_bytes: usize,
}

impl Default for DistOptions {
    fn default() -> Self {
        DistOptions { timeout_s: 30.0, transport: Transport::Auto, host: None, rendezvous: None, max_request_bytes: 64 << 20 }
    }
}

impl DistOptions {
    fn timeout(&self) -> Result<Duration> {
        if !(self.timeout_s.is_finite() && self.timeout_s > 0.0 && self.timeout_s < 1e7) {
            return Err(Error::invalid("timeout", format!("{} s; give a positive number of seconds", self.timeout_s)));
        }
        Ok(Duration::from_secs_f64(self.timeout_s))
    }

    fn file(&self, what: &str) -> Option<PathBuf> {
        self.rendezvous.as_ref().map(|(dir, ns)| dir.join(format!("{ns}.{what}")))
    }
}

/// Everything a reader needs to reach a store's variables (serialisable: a forked worker or
/// another process builds its own reader from it).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ReaderSpec {
    /// Every rank's endpoint, in rank order.
    pub endpoints: Vec<Endpoint>,
    /// Every variable's shards, in rank order.
    pub variables: BTreeMap<String, Vec<ShardMeta>>,
    /// Settings.
    pub options: DistOptions,
}

/// This host's identity: machines differ by boot id, network namespaces by their inode.
pub fn host_key() -> String {
    let boot = crate::io::read_bounded(std::path::Path::new("/proc/sys/kernel/random/boot_id"), 4096).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default();
    let net = std::fs::read_link("/proc/self/ns/net").map(|p| p.to_string_lossy().into_owned()).unwrap_or_default();
    format!("{}/{net}", boot.trim())
}

/// The first non-loopback IPv4 address of this host (network namespace), if any.
fn first_ipv4() -> Option<String> {
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

/// A tokio runtime owned by one process: a forked child that inherits it never touches it
/// (its threads do not exist there), it leaks it instead of joining threads that never end.
struct Rt {
    rt: Option<tokio::runtime::Runtime>,
    pid: u32,
}

impl Rt {
    fn new(name: &str) -> Result<Rt> {
        let rt = crate::io::runtime::build(name, Some(2), None)?;
        Ok(Rt { rt: Some(rt), pid: std::process::id() })
    }

    fn handle(&self) -> Result<&tokio::runtime::Runtime> {
        match &self.rt {
            Some(rt) if self.pid == std::process::id() => Ok(rt),
            _ => Err(Error::invalid(
                "store",
                "this distributed store belongs to the parent process; call fork_reader() in the forked worker".to_string(),
            )),
        }
    }

    /// Run `f` on the runtime and wait for it from any thread (also inside another runtime).
    fn block<F>(&self, f: F) -> Result<F::Output>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let h = self.handle()?.spawn(f);
        futures::executor::block_on(h).map_err(|e| Error::invalid("task", format!("a distributed-store task failed: {e}")))
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
struct Liveness {
    pid: u32,
    pidfd: Option<std::os::fd::OwnedFd>,
}

impl Liveness {
    fn new(pid: u32) -> Liveness {
        use std::os::fd::FromRawFd;
        // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) } as i32;
        // SAFETY: a non-negative return is a fresh descriptor nobody else owns.
        let pidfd = (fd >= 0).then(|| unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) });
        Liveness { pid, pidfd }
    }

    fn exited(&self) -> bool {
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

/// How one rank's shard of a variable is read.
enum Route {
    /// In this process, or opened from a process on this host (`owner` watched for exit).
    Local { source: Arc<dyn RecordSource>, owner: Option<Arc<Liveness>> },
    /// Rows in shared memory (this rank's, or mapped from a process on this host): copied
    /// straight into the destination.
    Shared { rows: Arc<SharedRows>, owner: Option<Arc<Liveness>> },
    /// Over Flight.
    Remote,
}

/// Per-variable counters (`get_profile`).
#[derive(Default, Debug)]
struct Counters {
    calls: AtomicU64,
    rows: AtomicU64,
    bytes: AtomicU64,
    requests: AtomicU64,
    local_ns: AtomicU64,
    wait_ns: AtomicU64,
    transfer_ns: AtomicU64,
}

/// A snapshot of a variable's counters.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Profile {
    /// Gathers.
    pub calls: u64,
    /// Rows gathered.
    pub rows: u64,
    /// Bytes of record data gathered.
    pub bytes: u64,
    /// Requests sent to other ranks.
    pub requests: u64,
    /// Seconds spent reading local and same-host shards.
    pub local_s: f64,
    /// Seconds the caller waited for other ranks after its local reads.
    pub wait_s: f64,
    /// Seconds of requests to other ranks (summed over requests in flight together).
    pub transfer_s: f64,
}

struct Variable {
    name: String,
    dtype: DType,
    layout: Layout,
    logical: Logical,
    /// `starts[r]` is rank r's first global row; `starts[size]` the total.
    starts: Vec<u64>,
    metas: Vec<ShardMeta>,
    routes: RwLock<Vec<Arc<Route>>>,
    counters: Counters,
}

struct Peer {
    endpoint: Mutex<Endpoint>,
    /// PEER_CONNECTIONS connections to it, made on first use.
    channel: Mutex<Option<Vec<Channel>>>,
}

/// TCP connections a reader keeps to each peer. One TCP stream carried about half of what two
/// do on the 2-core test VM (743-809 vs 398-458 us per MiB across two network namespaces, raw
/// sockets): requests are dealt over them and large answers split, so the kernel's work for
/// each stream can run on its own core at both ends.
const PEER_CONNECTIONS: usize = 2;

/// Answers at least this large are split into one request per connection (smaller ones stay
/// one request: its round trip costs more than a second stream gains).
const SPLIT_BYTES: usize = 8 << 20;

struct ReaderInner {
    rank: Option<usize>,
    host: String,
    rt: Rt,
    peers: RwLock<Vec<Arc<Peer>>>,
    vars: RwLock<HashMap<String, Arc<Variable>>>,
    options: DistOptions,
    timeout: Duration,
    /// This rank's own shards (a node's reader), read in place.
    local: Option<Shards>,
    /// Pool for batches of store-backed shards staged before their rows are copied out.
    staging: Allocator,
}

/// The read side of a distributed store: connections to every rank and the variables' shard
/// tables. Cheap to clone; [`DistReader::from_spec`] builds an independent one (own runtime,
/// own connections) for a forked worker or another thread.
#[derive(Clone)]
pub struct DistReader {
    inner: Arc<ReaderInner>,
}

impl std::fmt::Debug for DistReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DistReader(rank {:?}, {} ranks)", self.inner.rank, self.inner.peers.read().map(|p| p.len()).unwrap_or(0))
    }
}

fn lock_err<T>(_: T) -> Error {
    Error::invalid("store", "a distributed-store lock was poisoned by a panic".to_string())
}

impl DistReader {
    fn with(rank: Option<usize>, options: DistOptions, local: Option<Shards>) -> Result<DistReader> {
        let timeout = options.timeout()?;
        if let Some((_, ns)) = &options.rendezvous {
            check_ns(ns)?;
        }
        if options.max_request_bytes == 0 {
            return Err(Error::invalid("max_request_bytes", "must be positive".to_string()));
        }
        Ok(DistReader {
            inner: Arc::new(ReaderInner {
                rank,
                host: host_key(),
                rt: Rt::new("zrecord-dist")?,
                peers: RwLock::new(Vec::new()),
                vars: RwLock::new(HashMap::new()),
                options,
                timeout,
                local,
                staging: Allocator::default(),
            }),
        })
    }

    /// An independent reader of `spec`'s variables (own runtime and connections): what a
    /// forked worker or another process uses. Read-only.
    pub fn from_spec(spec: &ReaderSpec) -> Result<DistReader> {
        let r = DistReader::with(None, spec.options.clone(), None)?;
        r.set_endpoints(spec.endpoints.clone())?;
        for (name, metas) in &spec.variables {
            r.define(name, metas.clone())?;
        }
        Ok(r)
    }

    /// An extra member: waits (up to the timeout) for the `n_core` ranks of the group using
    /// rendezvous folder `dir` and namespace `ns` to publish their endpoints.
    pub fn join_group(dir: &Path, ns: &str, n_core: usize, options: DistOptions) -> Result<DistReader> {
        if n_core == 0 {
            return Err(Error::invalid("n_core", "a group has at least one rank".to_string()));
        }
        let options = DistOptions { rendezvous: Some((dir.to_path_buf(), ns.to_string())), ..options };
        let r = DistReader::with(None, options, None)?;
        let deadline = Instant::now() + r.inner.timeout;
        let mut endpoints = Vec::with_capacity(n_core);
        for rank in 0..n_core {
            let f = r.inner.options.file(&format!("node.{rank}")).unwrap_or_default();
            endpoints.push(serde_json::from_slice::<Endpoint>(&wait_for_file(&f, deadline, &format!("rank {rank}'s endpoint"))?).map_err(|e| Error::corrupt(&f, e.to_string()))?);
        }
        r.set_endpoints(endpoints)?;
        Ok(r)
    }

    /// Read the variable the group published as `name` (waits for it up to the timeout).
    pub fn join(&self, name: &str) -> Result<()> {
        let f = self.inner.options.file(&format!("var.{name}")).ok_or_else(|| Error::invalid("join", "needs a rendezvous folder".to_string()))?;
        let bytes = wait_for_file(&f, Instant::now() + self.inner.timeout, &format!("variable '{name}'"))?;
        let metas: Vec<ShardMeta> = serde_json::from_slice(&bytes).map_err(|e| Error::corrupt(&f, e.to_string()))?;
        self.define(name, metas)
    }

    fn set_endpoints(&self, endpoints: Vec<Endpoint>) -> Result<()> {
        for (r, e) in endpoints.iter().enumerate() {
            if e.rank != r {
                return Err(Error::invalid("endpoints", format!("entry {r} is rank {}", e.rank)));
            }
        }
        let peers = endpoints.into_iter().map(|e| Arc::new(Peer { endpoint: Mutex::new(e), channel: Mutex::new(None) })).collect();
        *self.inner.peers.write().map_err(lock_err)? = peers;
        Ok(())
    }

    /// Ranks in the group.
    pub fn size(&self) -> usize {
        self.inner.peers.read().map(|p| p.len()).unwrap_or(0)
    }

    /// Register variable `name` from every rank's shard description (in rank order).
    pub fn define(&self, name: &str, metas: Vec<ShardMeta>) -> Result<()> {
        let size = self.size();
        if metas.len() != size {
            return Err(Error::invalid("shards", format!("'{name}' has {} shards for {size} ranks", metas.len())));
        }
        let first = metas.first().ok_or_else(|| Error::invalid("shards", format!("'{name}' has no shard")))?;
        let (dtype, layout) = (DType::from_name(&first.dtype)?, first.layout()?);
        let logical: Logical = first.logical.parse()?;
        let mut starts = vec![0u64];
        for (r, m) in metas.iter().enumerate() {
            if m.rank != r {
                return Err(Error::invalid("shards", format!("shard {r} of '{name}' is rank {}'s", m.rank)));
            }
            if m.dtype != first.dtype || m.layout()? != layout || m.logical != first.logical {
                return Err(Error::ShapeMismatch {
                    expected: format!("rank 0's {} {layout} records for '{name}'", first.dtype),
                    found: format!("rank {r}'s {} {}", m.dtype, m.layout()?),
                });
            }
            let next = starts[r].checked_add(m.rows).ok_or_else(|| Error::invalid("shards", format!("'{name}' has more than 2^64 rows")))?;
            starts.push(next);
        }
        let routes = (0..size).map(|r| self.route(name, &metas[r])).collect::<Result<Vec<_>>>()?;
        let var = Variable { name: name.to_string(), dtype, layout, logical, starts, metas, routes: RwLock::new(routes), counters: Counters::default() };
        self.inner.vars.write().map_err(lock_err)?.insert(name.to_string(), Arc::new(var));
        Ok(())
    }

    /// How this reader reaches `meta`'s shard.
    fn route(&self, name: &str, meta: &ShardMeta) -> Result<Arc<Route>> {
        let inner = &self.inner;
        if Some(meta.rank) == inner.rank {
            if let Some(local) = &inner.local {
                if let Some(served) = local.read().map_err(lock_err)?.get(name) {
                    return Ok(Arc::new(match &served.rows {
                        Some(rows) => Route::Shared { rows: rows.clone(), owner: None },
                        None => Route::Local { source: served.source.clone(), owner: None },
                    }));
                }
            }
        }
        let ep = self.endpoint(meta.rank)?;
        let same_host = ep.host == inner.host;
        match inner.options.transport {
            Transport::Flight => return Ok(Arc::new(Route::Remote)),
            Transport::Shm if !same_host => {
                return Err(Error::invalid("transport", format!("'shm' but rank {} is on another host ({})", meta.rank, ep.addr)));
            }
            _ if !same_host => return Ok(Arc::new(Route::Remote)),
            _ => {}
        }
        let owner = Some(Arc::new(Liveness::new(ep.pid)));
        let opened: Result<Route> = match (&meta.fd, &meta.store) {
            (Some(fd), _) => {
                let shape = meta.item_shape.clone().unwrap_or_default();
                SharedRows::open_peer(name, ep.pid, *fd, meta.rows, DType::from_name(&meta.dtype)?, shape).map(|rows| Route::Shared { rows: Arc::new(rows), owner })
            }
            (None, Some(path)) => Store::open(path).and_then(|s| {
                let source = s.source();
                if source.len() != meta.rows {
                    return Err(Error::ShapeMismatch { expected: format!("{} rows of rank {}", meta.rows, meta.rank), found: format!("{} rows in {path}", source.len()) });
                }
                Ok(Route::Local { source, owner })
            }),
            (None, None) => Err(Error::invalid("shard", "served over Flight only".to_string())),
        };
        match opened {
            Ok(route) => Ok(Arc::new(route)),
            // Not reachable in place (permissions, a store view): Flight still is, unless only
            // shared memory was asked for.
            Err(_) if inner.options.transport == Transport::Auto => Ok(Arc::new(Route::Remote)),
            Err(e) => Err(e),
        }
    }

    fn endpoint(&self, rank: usize) -> Result<Endpoint> {
        let peers = self.inner.peers.read().map_err(lock_err)?;
        let size = peers.len();
        let p = peers.get(rank).ok_or_else(|| Error::invalid("rank", format!("{rank} is not in a group of {size}")))?;
        let ep = p.endpoint.lock().map_err(lock_err)?.clone();
        Ok(ep)
    }

    fn variable(&self, name: &str) -> Result<Arc<Variable>> {
        self.inner.vars.read().map_err(lock_err)?.get(name).cloned().ok_or_else(|| Error::invalid("name", format!("no variable '{name}' in this distributed store")))
    }

    /// Variable `name` as a record source (global ids: rank 0's rows, then rank 1's, ...).
    pub fn source(&self, name: &str) -> Result<Arc<DistSource>> {
        Ok(Arc::new(DistSource { reader: self.clone(), var: self.variable(name)? }))
    }

    /// Names of the variables.
    pub fn names(&self) -> Vec<String> {
        let mut v: Vec<String> = self.inner.vars.read().map(|m| m.keys().cloned().collect()).unwrap_or_default();
        v.sort();
        v
    }

    /// `(total rows, rows per rank)` of `name`.
    pub fn rows(&self, name: &str) -> Result<(u64, Vec<u64>)> {
        let v = self.variable(name)?;
        Ok((v.starts[v.starts.len() - 1], v.metas.iter().map(|m| m.rows).collect()))
    }

    /// `name`'s counters.
    pub fn profile(&self, name: &str) -> Result<Profile> {
        let c = &self.variable(name)?.counters;
        let s = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64 * 1e-9;
        Ok(Profile {
            calls: c.calls.load(Ordering::Relaxed),
            rows: c.rows.load(Ordering::Relaxed),
            bytes: c.bytes.load(Ordering::Relaxed),
            requests: c.requests.load(Ordering::Relaxed),
            local_s: s(&c.local_ns),
            wait_s: s(&c.wait_ns),
            transfer_s: s(&c.transfer_ns),
        })
    }

    /// What an independent reader needs ([`DistReader::from_spec`]).
    pub fn spec(&self) -> Result<ReaderSpec> {
        let peers = self.inner.peers.read().map_err(lock_err)?;
        let endpoints = peers.iter().map(|p| p.endpoint.lock().map(|e| e.clone()).map_err(lock_err)).collect::<Result<Vec<_>>>()?;
        let variables = self.inner.vars.read().map_err(lock_err)?.iter().map(|(k, v)| (k.clone(), v.metas.clone())).collect();
        Ok(ReaderSpec { endpoints, variables, options: self.inner.options.clone() })
    }

    /// Drop every variable and connection.
    pub fn clear(&self) {
        if let Ok(mut v) = self.inner.vars.write() {
            v.clear();
        }
        if let Ok(peers) = self.inner.peers.read() {
            for p in peers.iter() {
                if let Ok(mut c) = p.channel.lock() {
                    *c = None;
                }
            }
        }
    }

    fn channels(&self, rank: usize) -> Result<Vec<Channel>> {
        let peers = self.inner.peers.read().map_err(lock_err)?;
        let peer = peers.get(rank).ok_or_else(|| Error::invalid("rank", format!("{rank}")))?;
        let mut ch = peer.channel.lock().map_err(lock_err)?;
        if let Some(c) = ch.as_ref() {
            return Ok(c.clone());
        }
        let addr = peer.endpoint.lock().map_err(lock_err)?.addr.clone();
        let timeout = self.inner.timeout;
        let ep = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|e| Error::invalid("address", format!("rank {rank}'s address '{addr}': {e}")))?
            .connect_timeout(timeout)
            .tcp_nodelay(true)
            .initial_stream_window_size(Some(flight::STREAM_WINDOW))
            .initial_connection_window_size(Some(flight::CONNECTION_WINDOW))
            .max_frame_size(Some(flight::MAX_FRAME));
        // connect_lazy spawns its worker on the current runtime: enter ours.
        let _guard = self.inner.rt.handle()?.enter();
        let c: Vec<Channel> = (0..PEER_CONNECTIONS).map(|_| ep.connect_lazy()).collect();
        *ch = Some(c.clone());
        Ok(c)
    }

    /// After a failed request to `rank`: if the rendezvous folder shows it restarted (a new
    /// endpoint), reconnect and re-read its shards. True when something changed.
    fn refresh(&self, rank: usize) -> Result<bool> {
        let Some(f) = self.inner.options.file(&format!("node.{rank}")) else { return Ok(false) };
        let Ok(Some(bytes)) = crate::io::read_optional(&f, crate::dist::comm::MAX_MESSAGE_BYTES) else { return Ok(false) };
        let Ok(ep) = serde_json::from_slice::<Endpoint>(&bytes) else { return Ok(false) };
        {
            let peers = self.inner.peers.read().map_err(lock_err)?;
            let Some(peer) = peers.get(rank) else { return Ok(false) };
            let mut cur = peer.endpoint.lock().map_err(lock_err)?;
            if *cur == ep {
                return Ok(false);
            }
            *cur = ep;
            *peer.channel.lock().map_err(lock_err)? = None;
        }
        let vars: Vec<Arc<Variable>> = self.inner.vars.read().map_err(lock_err)?.values().cloned().collect();
        for v in vars {
            let meta = self.inner.options.file(&format!("shard.{}.{rank}", v.name)).and_then(|f| crate::io::read_optional(&f, crate::dist::comm::MAX_MESSAGE_BYTES).ok().flatten()).and_then(|b| serde_json::from_slice::<ShardMeta>(&b).ok());
            let meta = match meta {
                Some(m) if m.rows == v.metas[rank].rows && m.dtype == v.metas[rank].dtype => m,
                _ => v.metas[rank].clone(),
            };
            let route = self.route(&v.name, &meta)?;
            v.routes.write().map_err(lock_err)?[rank] = route;
        }
        Ok(true)
    }
}

/// Wait until `f` exists (a file written atomically by another process) and read it.
fn wait_for_file(f: &Path, deadline: Instant, what: &str) -> Result<Vec<u8>> {
    let mut pause = Duration::from_millis(1);
    loop {
        if let Some(b) = crate::io::read_optional(f, crate::dist::comm::MAX_MESSAGE_BYTES)? {
            return Ok(b);
        }
        if Instant::now() >= deadline {
            return Err(Error::Timeout { what: format!("{what} ({} never appeared)", f.display()) });
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

/// One variable of a distributed store as a [`RecordSource`]: a gather sends all rows owned
/// by one rank in one request (split past `max_request_bytes`), requests to every rank in
/// flight together, reads this rank's and same-host shards in place meanwhile, and assembles
/// the batch in the order of `ids`.
pub struct DistSource {
    reader: DistReader,
    var: Arc<Variable>,
}

impl std::fmt::Debug for DistSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DistSource('{}', {} rows over {} ranks)", self.var.name, self.len(), self.var.metas.len())
    }
}

/// The rows one rank contributes to a gather: its local ids and their positions in the batch.
#[derive(Default)]
struct Group {
    ids: Vec<u64>,
    pos: Vec<usize>,
}

/// A message of a remote answer as it arrives: request `req` of the gather, one record batch
/// of it (the answer's messages in order), and with its last one how the request ended (its
/// time, or the failure and whether it timed out). Requests send these to the gathering
/// thread, which places each batch's rows while the next are still on the wire; the tasks
/// never touch the destination, so a gather that fails early leaves nothing writing into it.
struct Arrival {
    req: usize,
    batch: Option<arrow_array::RecordBatch>,
    done: Option<std::result::Result<u64, (String, bool)>>,
}

/// A request in flight: the owner, the positions of its ids in the owner's group, rows placed.
struct InFlight {
    rank: usize,
    range: std::ops::Range<usize>,
    placed: usize,
}

impl DistSource {
    /// Rows per rank.
    pub fn shard_rows(&self) -> Vec<u64> {
        self.var.metas.iter().map(|m| m.rows).collect()
    }

    /// The owning rank of global row `id` and its row in that shard (`id < len`).
    pub fn owner(&self, id: u64) -> (usize, u64) {
        let r = self.var.starts.partition_point(|&s| s <= id) - 1;
        (r, id - self.var.starts[r])
    }

    fn peer_error(&self, rank: usize, message: String, timed_out: bool) -> Error {
        let addr = self.reader.endpoint(rank).map(|e| e.addr).unwrap_or_default();
        Error::Peer { rank, variable: self.var.name.clone(), message: format!("{message} (at {addr})"), timed_out }
    }

    fn row_bytes(&self) -> usize {
        match &self.var.layout {
            Layout::Dense { item_shape } => item_shape.iter().product::<usize>() * self.var.dtype.size(),
            Layout::Ragged { .. } => 0,
        }
    }

    /// Start the requests for `group` of `rank` (split into pieces of at most
    /// `max_request_bytes` for dense rows, 65536 ids for ragged ones; dense answers of
    /// SPLIT_BYTES or more into at least one piece per connection, dealt over them in turn);
    /// their answers arrive on `tx` under their index in `inflight`.
    fn send(&self, rank: usize, group: &Group, tx: &tokio::sync::mpsc::UnboundedSender<Arrival>, inflight: &mut Vec<InFlight>) -> Result<()> {
        let rb = self.row_bytes();
        let mut per = self.reader.inner.options.max_request_bytes.checked_div(rb).map_or(1 << 16, |p| p.max(1));
        let n = group.ids.len();
        if rb > 0 && n.saturating_mul(rb) >= SPLIT_BYTES {
            // Large answers: at least one request per connection.
            per = per.min(n.div_ceil(PEER_CONNECTIONS)).max(1);
        }
        let channels = self.reader.channels(rank)?;
        let timeout = self.reader.inner.timeout;
        let rt = self.reader.inner.rt.handle()?;
        let mut at = 0;
        while at < group.ids.len() {
            let end = (at + per).min(group.ids.len());
            let ticket = flight::encode_ticket(&self.var.name, &group.ids[at..end]);
            let (ch, tx, req) = (channels[inflight.len() % channels.len()].clone(), tx.clone(), inflight.len());
            rt.spawn(async move {
                let t0 = Instant::now();
                let call = async {
                    let mut client = FlightServiceClient::new(ch).max_decoding_message_size(flight::MAX_MESSAGE_BYTES).max_encoding_message_size(flight::MAX_MESSAGE_BYTES);
                    let stream = client.do_get(Ticket { ticket: ticket.into() }).await.map_err(|s| s.message().to_string() + &format!(" [{:?}]", s.code()))?.into_inner();
                    let mut batches = arrow_flight::decode::FlightRecordBatchStream::new_from_flight_data(stream.map_err(arrow_flight::error::FlightError::from));
                    // Each batch goes out as soon as the next one arrives; the last one with
                    // the outcome (one wake-up of the gathering thread for a one-message answer).
                    let mut held = None;
                    while let Some(b) = batches.try_next().await.map_err(|e| e.to_string())? {
                        if let Some(prev) = held.replace(b) {
                            if tx.send(Arrival { req, batch: Some(prev), done: None }).is_err() {
                                return Ok(None); // the gather gave up: nobody is waiting
                            }
                        }
                    }
                    Ok::<_, String>(held)
                };
                let end = match tokio::time::timeout(timeout, call).await {
                    Ok(Ok(last)) => Arrival { req, batch: last, done: Some(Ok(t0.elapsed().as_nanos() as u64)) },
                    Ok(Err(m)) => Arrival { req, batch: None, done: Some(Err((m, false))) },
                    Err(_) => Arrival { req, batch: None, done: Some(Err((format!("no answer within {:.1} s", timeout.as_secs_f64()), true))) },
                };
                let _ = tx.send(end);
            });
            inflight.push(InFlight { rank, range: at..end, placed: 0 });
            self.var.counters.requests.fetch_add(1, Ordering::Relaxed);
            at = end;
        }
        Ok(())
    }

    /// Start the requests to remote owners, then read local and same-host shards with
    /// `local`, then hand each remote answer to `remote`. Returns the rows handled.
    fn run(
        &self,
        groups: &[Group],
        mut local: impl FnMut(usize, &Route, &Group) -> Result<()>,
        mut remote: impl FnMut(usize, std::ops::Range<usize>, Received) -> Result<()>,
    ) -> Result<()> {
        let routes: Vec<Arc<Route>> = self.var.routes.read().map_err(lock_err)?.clone();
        // Remote requests first, so they are in flight while local shards are read.
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let mut inflight = Vec::new();
        for (r, g) in groups.iter().enumerate() {
            if !g.ids.is_empty() && matches!(*routes[r], Route::Remote) {
                self.send(r, g, &tx, &mut inflight)?;
            }
        }
        drop(tx);
        let t0 = Instant::now();
        for (r, g) in groups.iter().enumerate() {
            if g.ids.is_empty() {
                continue;
            }
            let owner = match &*routes[r] {
                Route::Remote => continue,
                Route::Local { owner, .. } | Route::Shared { owner, .. } => owner,
            };
            if owner.as_ref().is_some_and(|o| o.exited()) {
                return Err(self.peer_error(r, "the rank's process exited".into(), false));
            }
            local(r, &routes[r], g)?;
        }
        let t1 = Instant::now();
        self.var.counters.local_ns.fetch_add((t1 - t0).as_nanos() as u64, Ordering::Relaxed);
        // Answers are placed as their messages arrive, in whatever order the owners send them.
        let (ragged, rb) = (matches!(self.var.layout, Layout::Ragged { .. }), self.row_bytes());
        let mut open = inflight.len();
        while open > 0 {
            let a = futures::executor::block_on(rx.recv()).ok_or_else(|| Error::invalid("gather", format!("a request for '{}' ended without an answer", self.var.name)))?;
            let f = &mut inflight[a.req];
            if let Some(b) = a.batch {
                let got = flight::received(b, ragged, rb).map_err(|m| self.peer_error(f.rank, m, false))?;
                let n = got.rows(rb);
                if f.placed + n > f.range.len() {
                    return Err(self.peer_error(f.rank, format!("answered more than the {} rows asked", f.range.len()), false));
                }
                let at = f.range.start + f.placed;
                remote(f.rank, at..at + n, got)?;
                f.placed += n;
            }
            if let Some(done) = a.done {
                let ns = done.map_err(|(m, t)| self.peer_error(f.rank, m, t))?;
                self.var.counters.transfer_ns.fetch_add(ns, Ordering::Relaxed);
                if f.placed != f.range.len() {
                    return Err(self.peer_error(f.rank, format!("answered {} rows for {} ids", f.placed, f.range.len()), false));
                }
                open -= 1;
            }
        }
        self.var.counters.wait_ns.fetch_add(t1.elapsed().as_nanos() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Dense rows `groups` straight into `out` (each position written once).
    fn gather_dense(&self, groups: &[Group], out: &Out, options: &ReadOptions) -> Result<()> {
        let rb = self.row_bytes();
        let written = AtomicU64::new(0);
        self.run(
            groups,
            |_, route, g| {
                match route {
                    Route::Shared { rows, .. } => rows.copy_rows_to(&g.ids, &g.pos, out, options.parallel)?,
                    Route::Local { source, .. } => {
                        let b = source.gather(Ids::List(&g.ids), &self.reader.inner.staging, options)?;
                        let t = b.into_dense(&self.var.name)?;
                        for (k, &p) in g.pos.iter().enumerate() {
                            out.put(p, &t.as_bytes()[k * rb..(k + 1) * rb])?;
                        }
                    }
                    Route::Remote => {}
                }
                written.fetch_add(g.ids.len() as u64, Ordering::Relaxed);
                Ok(())
            },
            |r, range, got| {
                let Received::Dense(rows) = got else { return Err(self.peer_error(r, "sent ragged rows".into(), false)) };
                for (&p, row) in groups[r].pos[range.clone()].iter().zip(rows.as_slice().chunks_exact(rb.max(1))) {
                    out.put(p, row)?;
                }
                written.fetch_add(range.len() as u64, Ordering::Relaxed);
                Ok(())
            },
        )?;
        let n: usize = groups.iter().map(|g| g.ids.len()).sum();
        if written.load(Ordering::Relaxed) != n as u64 {
            return Err(Error::invalid("gather", format!("{} of {n} rows of '{}' arrived", written.load(Ordering::Relaxed), self.var.name)));
        }
        Ok(())
    }

    /// Ragged records of `groups`, packed in the order of their positions.
    fn gather_ragged(&self, groups: &[Group], n: usize, ndim: usize, allocator: &Allocator, options: &ReadOptions) -> Result<Batch> {
        let mut local: Vec<(usize, Batch)> = Vec::new();
        let mut remote: Vec<(usize, std::ops::Range<usize>, Received)> = Vec::new();
        self.run(
            groups,
            |r, route, g| {
                let source: &Arc<dyn RecordSource> = match route {
                    Route::Local { source, .. } => source,
                    _ => return Err(Error::WrongKind { path: self.var.name.clone().into(), expected: "ragged", found: "dense" }),
                };
                local.push((r, source.gather(Ids::List(&g.ids), allocator, options)?));
                Ok(())
            },
            |r, range, got| {
                remote.push((r, range, got));
                Ok(())
            },
        )?;
        let dtype = self.var.dtype;
        let mut slots: Vec<Option<TensorView<'_>>> = (0..n).map(|_| None).collect();
        for (r, b) in &local {
            let rb = b.as_ragged().ok_or_else(|| Error::WrongKind { path: self.var.name.clone().into(), expected: "ragged", found: "dense" })?;
            let (cu, shapes, values) = (rb.cu_seqlens_slice(), rb.shapes_slice(), rb.values().as_bytes());
            for (k, &p) in groups[*r].pos.iter().enumerate() {
                let (a, z) = (cu[k] as usize * dtype.size(), cu[k + 1] as usize * dtype.size());
                let shape = shapes[k * ndim..(k + 1) * ndim].iter().map(|&d| d as usize).collect();
                slots[p] = Some(TensorView::new(&values[a..z], dtype, shape));
            }
        }
        for (r, range, got) in &remote {
            let Received::Ragged(data, shape_col) = got else { return Err(self.peer_error(*r, "sent dense rows".into(), false)) };
            let shapes = flight::shape_values(shape_col).ok_or_else(|| self.peer_error(*r, "malformed shape column".into(), false))?;
            if shape_col.value_length() as usize != ndim || shapes.len() != data.len() * ndim {
                return Err(self.peer_error(*r, format!("shapes of {} dims, {ndim} expected", shape_col.value_length()), false));
            }
            for k in 0..data.len() {
                let shape = shapes[k * ndim..(k + 1) * ndim].iter().map(|&d| d as usize).collect();
                slots[groups[*r].pos[range.start + k]] = Some(TensorView::new(data.value(k), dtype, shape));
            }
        }
        let views: Vec<TensorView<'_>> = slots.into_iter().enumerate().map(|(k, s)| s.ok_or_else(|| Error::invalid("gather", format!("row {k} of '{}' never arrived", self.var.name)))).collect::<Result<_>>()?;
        Ok(Batch::Ragged(RaggedBatch::pack(allocator, dtype, ndim, views.iter())?))
    }

    /// Group `ids` by owning rank (validated against the length first).
    fn groups(&self, ids: &Ids<'_>) -> Result<Vec<Group>> {
        ids.validate(self.len(), Path::new(&self.var.name))?;
        let mut groups: Vec<Group> = (0..self.var.metas.len()).map(|_| Group::default()).collect();
        for k in 0..ids.len() {
            let (r, local) = self.owner(ids.get(k));
            groups[r].ids.push(local);
            groups[r].pos.push(k);
        }
        let c = &self.var.counters;
        c.calls.fetch_add(1, Ordering::Relaxed);
        c.rows.fetch_add(ids.len() as u64, Ordering::Relaxed);
        Ok(groups)
    }

    /// Retry once after a peer failure if the rank restarted (a new endpoint published).
    fn retrying<T>(&self, mut f: impl FnMut() -> Result<T>) -> Result<T> {
        match f() {
            Err(Error::Peer { rank, .. }) if self.reader.refresh(rank)? => f(),
            other => other,
        }
    }

    /// Dense rows `ids` straight into `len` bytes at `dst` (no intermediate batch).
    ///
    /// # Safety
    /// `dst` must be valid for writes of `len` bytes for the duration of the call, and not
    /// read or written by anyone else meanwhile.
    pub unsafe fn gather_into(&self, ids: Ids<'_>, dst: *mut u8, len: usize, options: &ReadOptions) -> Result<()> {
        let rb = self.row_bytes();
        if !matches!(self.var.layout, Layout::Dense { .. }) {
            return Err(Error::WrongKind { path: self.var.name.clone().into(), expected: "dense", found: "ragged" });
        }
        if ids.len().checked_mul(rb) != Some(len) {
            return Err(Error::ShapeMismatch { expected: format!("{} bytes for {} rows of {rb} bytes", ids.len().saturating_mul(rb), ids.len()), found: format!("{len} bytes") });
        }
        let groups = self.groups(&ids)?;
        if len == 0 {
            // No bytes to move (no ids, or records of zero elements): nothing to ask anyone.
            return Ok(());
        }
        let out = Out { ptr: dst, len, row: rb };
        self.retrying(|| self.gather_dense(&groups, &out, options))?;
        self.var.counters.bytes.fetch_add(len as u64, Ordering::Relaxed);
        Ok(())
    }
}

/// Destination of a dense gather: `len` bytes at `ptr`, written one row at a time.
pub(crate) struct Out {
    ptr: *mut u8,
    len: usize,
    row: usize,
}

// SAFETY: an `Out` is only shared while rows are written to distinct positions (every id of a
// gather has its own position), so no two threads write the same bytes.
unsafe impl Send for Out {}
// SAFETY: as above.
unsafe impl Sync for Out {}

impl Out {
    /// `len` bytes at `ptr` in rows of `row` bytes.
    ///
    /// # Safety
    /// `ptr` must be valid for writes of `len` bytes while the `Out` is used, and not read or
    /// written by anyone else meanwhile.
    pub(crate) unsafe fn new(ptr: *mut u8, len: usize, row: usize) -> Out {
        Out { ptr, len, row }
    }

    /// Row `pos` of the destination, `row` bytes, bounds-checked.
    pub(crate) fn row_ptr(&self, pos: usize) -> Result<*mut u8> {
        match pos.checked_add(1).and_then(|e| e.checked_mul(self.row)) {
            Some(end) if end <= self.len => Ok(self.ptr.wrapping_add(pos * self.row)),
            _ => Err(Error::invalid("gather", format!("row {pos} lies outside the {}-byte destination", self.len))),
        }
    }

    /// Bytes per row.
    pub(crate) fn row(&self) -> usize {
        self.row
    }

    fn put(&self, pos: usize, src: &[u8]) -> Result<()> {
        if src.len() != self.row {
            return Err(Error::invalid("gather", format!("a row of {} bytes, {} expected", src.len(), self.row)));
        }
        let dst = self.row_ptr(pos)?;
        // SAFETY: `dst..dst + row` lies in the destination (checked); the source is a separate
        // buffer (a received or gathered batch, never the destination).
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, self.row) };
        Ok(())
    }
}

impl RecordSource for DistSource {
    fn name(&self) -> String {
        format!("distributed variable '{}'", self.var.name)
    }

    fn len(&self) -> u64 {
        self.var.starts[self.var.starts.len() - 1]
    }

    fn dtype(&self) -> DType {
        self.var.dtype
    }

    fn layout(&self) -> Layout {
        self.var.layout.clone()
    }

    fn logical(&self) -> Logical {
        self.var.logical
    }

    fn gather(&self, ids: Ids<'_>, allocator: &Allocator, options: &ReadOptions) -> Result<Batch> {
        let n = ids.len();
        let b = match &self.var.layout {
            Layout::Dense { item_shape } => {
                let bytes = n.checked_mul(self.row_bytes()).ok_or_else(|| Error::invalid("ids", format!("{n} rows overflow")))?;
                let mut alloc = allocator.allocate(bytes)?;
                let dst = alloc.as_uninit_mut().as_mut_ptr().cast::<u8>();
                // SAFETY: `dst` is the fresh allocation's `bytes` writable bytes, ours alone.
                unsafe { self.gather_into(ids, dst, bytes, options)? };
                let mut shape = vec![n];
                shape.extend_from_slice(item_shape);
                // SAFETY: gather_into wrote every row (it fails unless all `n` rows arrived).
                return Ok(Batch::Dense(unsafe { Tensor::from_initialized(Arc::new(alloc), 0, self.var.dtype, shape) }));
            }
            Layout::Ragged { ndim } => {
                let groups = self.groups(&ids)?;
                let mut owners = groups.iter().enumerate().filter(|(_, g)| !g.ids.is_empty());
                let single = match (owners.next(), owners.next()) {
                    (Some((r, g)), None) => Some((r, g)),
                    _ => None,
                };
                let route = single.map(|(r, _)| self.var.routes.read().map(|routes| routes[r].clone())).transpose().map_err(lock_err)?;
                match (single, route.as_deref()) {
                    // One owner read in place: its batch is already in the order of `ids`.
                    (Some((r, g)), Some(Route::Local { source, owner })) => {
                        if owner.as_ref().is_some_and(|o| o.exited()) {
                            return Err(self.peer_error(r, "the rank's process exited".into(), false));
                        }
                        source.gather(Ids::List(&g.ids), allocator, options)?
                    }
                    _ => self.retrying(|| self.gather_ragged(&groups, n, *ndim, allocator, options))?,
                }
            }
        };
        self.var.counters.bytes.fetch_add(b.nbytes() as u64, Ordering::Relaxed);
        Ok(b)
    }
}

/// One rank of a distributed store: its shards, the Flight server that serves them, and a
/// reader of every variable. Collectives (exchanging endpoints and shard descriptions) are
/// the caller's: MPI, [`crate::dist::FileComm`], or threads in a test.
pub struct DistNode {
    rank: usize,
    size: usize,
    shards: Shards,
    owned: Mutex<HashMap<String, Arc<SharedRows>>>,
    reader: DistReader,
    endpoint: Endpoint,
    stop: Mutex<Option<tokio::sync::oneshot::Sender<()>>>,
}

impl std::fmt::Debug for DistNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DistNode(rank {} of {}, {})", self.rank, self.size, self.endpoint.addr)
    }
}

impl DistNode {
    /// Start rank `rank` of `size`: its Flight server listens on an ephemeral port of every
    /// interface; with a rendezvous folder its endpoint is published there.
    pub fn start(rank: usize, size: usize, options: DistOptions) -> Result<DistNode> {
        if size == 0 || rank >= size {
            return Err(Error::invalid("rank", format!("rank {rank} is not in a group of {size}")));
        }
        let shards: Shards = Arc::default();
        let reader = DistReader::with(Some(rank), options.clone(), Some(shards.clone()))?;
        let listener = reader.inner.rt.block(async { tokio::net::TcpListener::bind(("0.0.0.0", 0)).await })?.map_err(|e| Error::io("0.0.0.0:0", e))?;
        let port = listener.local_addr().map_err(|e| Error::io("listener", e))?.port();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let service = ShardService { shards: shards.clone(), allocator: Allocator::default() };
        reader.inner.rt.handle()?.spawn(flight::serve(service, listener, rx));
        let host = options.host.clone().or_else(|| std::env::var("ZRECORD_DIST_HOST").ok()).or_else(first_ipv4).unwrap_or_else(|| "127.0.0.1".into());
        let endpoint = Endpoint { rank, addr: format!("{host}:{port}"), host: host_key(), pid: std::process::id() };
        if let Some(f) = options.file(&format!("node.{rank}")) {
            write_atomic(&f, &serde_json::to_vec(&endpoint).map_err(|e| Error::invalid("endpoint", e.to_string()))?)?;
        }
        Ok(DistNode { rank, size, shards, owned: Mutex::default(), reader, endpoint, stop: Mutex::new(Some(tx)) })
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Ranks in the group.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Where this rank serves.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// The reader of every variable.
    pub fn reader(&self) -> &DistReader {
        &self.reader
    }

    /// Set every rank's endpoint (rank order), as gathered from all ranks.
    pub fn connect(&self, endpoints: Vec<Endpoint>) -> Result<()> {
        if endpoints.len() != self.size {
            return Err(Error::invalid("endpoints", format!("{} endpoints for {} ranks", endpoints.len(), self.size)));
        }
        self.reader.set_endpoints(endpoints)
    }

    fn register(&self, name: &str, source: Arc<dyn RecordSource>, rows: Option<Arc<SharedRows>>) -> Result<()> {
        if name.is_empty() || name.contains(['/', '\0']) {
            return Err(Error::invalid("name", format!("'{name}' (non-empty, no '/')")));
        }
        let mut shards = self.shards.write().map_err(lock_err)?;
        if shards.contains_key(name) {
            return Err(Error::invalid("name", format!("variable '{name}' is already registered on rank {}", self.rank)));
        }
        shards.insert(name.to_string(), Served { source, rows });
        Ok(())
    }

    fn publish_shard(&self, name: &str, meta: &ShardMeta) -> Result<()> {
        if let Some(f) = self.reader.inner.options.file(&format!("shard.{name}.{}", self.rank)) {
            write_atomic(&f, &serde_json::to_vec(meta).map_err(|e| Error::invalid("shard", e.to_string()))?)?;
        }
        Ok(())
    }

    /// A shard of `rows` zero rows of `dtype` and `item_shape` in shared memory, written with
    /// [`DistNode::update`]. Returns its description for the other ranks.
    pub fn add_rows(&self, name: &str, rows: u64, dtype: DType, item_shape: Vec<usize>) -> Result<ShardMeta> {
        let s = Arc::new(SharedRows::create(name, rows, dtype, item_shape.clone())?);
        self.register(name, s.clone(), Some(s.clone()))?;
        self.owned.lock().map_err(lock_err)?.insert(name.to_string(), s.clone());
        let meta = ShardMeta { rank: self.rank, rows, dtype: dtype.to_string(), item_shape: Some(item_shape), ndim: None, logical: Logical::Tensor.to_string(), fd: s.fd(), store: None };
        self.publish_shard(name, &meta)?;
        Ok(meta)
    }

    /// A shard served from any record source (a store or a view). `store`: the folder of a
    /// whole local store, which readers on this host open themselves instead of asking.
    pub fn add_source(&self, name: &str, source: Arc<dyn RecordSource>, store: Option<String>) -> Result<ShardMeta> {
        let layout = source.layout();
        let meta = ShardMeta {
            rank: self.rank,
            rows: source.len(),
            dtype: source.dtype().to_string(),
            item_shape: match &layout {
                Layout::Dense { item_shape } => Some(item_shape.clone()),
                Layout::Ragged { .. } => None,
            },
            ndim: match layout {
                Layout::Ragged { ndim } => Some(ndim),
                Layout::Dense { .. } => None,
            },
            logical: source.logical().to_string(),
            fd: None,
            store,
        };
        self.register(name, source, None)?;
        self.publish_shard(name, &meta)?;
        Ok(meta)
    }

    /// Overwrite rows `offset..` of this rank's shared shard `name` with `bytes` (whole rows).
    pub fn update(&self, name: &str, offset: u64, bytes: &[u8]) -> Result<()> {
        let owned = self.owned.lock().map_err(lock_err)?;
        let s = owned.get(name).ok_or_else(|| Error::invalid("name", format!("rank {} holds no writable variable '{name}' (init or add it first)", self.rank)))?;
        s.write_rows(offset, bytes)
    }

    /// Register variable `name` from every rank's shard description; rank 0 publishes it to
    /// the rendezvous folder for extra members.
    pub fn define(&self, name: &str, metas: Vec<ShardMeta>) -> Result<()> {
        if !self.shards.read().map_err(lock_err)?.contains_key(name) {
            return Err(Error::invalid("name", format!("rank {} has not added '{name}'", self.rank)));
        }
        self.reader.define(name, metas.clone())?;
        if self.rank == 0 {
            if let Some(f) = self.reader.inner.options.file(&format!("var.{name}")) {
                write_atomic(&f, &serde_json::to_vec(&metas).map_err(|e| Error::invalid("shards", e.to_string()))?)?;
            }
        }
        Ok(())
    }

    /// Stop serving and drop every shard and connection. Idempotent.
    pub fn free(&self) {
        if let Some(tx) = self.stop.lock().ok().and_then(|mut s| s.take()) {
            let _ = tx.send(());
        }
        self.reader.clear();
        if let Ok(mut s) = self.shards.write() {
            s.clear();
        }
        if let Ok(mut o) = self.owned.lock() {
            o.clear();
        }
    }
}

impl Drop for DistNode {
    fn drop(&mut self) {
        self.free();
    }
}
