//! The read side: connections to every rank and each variable's shard table ([`DistReader`]).

#[allow(unused_imports)]
use super::*;

/// How one rank's shard of a variable is read.
pub(super) enum Route {
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
pub(super) struct Counters {
    pub(super) calls: AtomicU64,
    pub(super) rows: AtomicU64,
    pub(super) bytes: AtomicU64,
    pub(super) requests: AtomicU64,
    pub(super) local_ns: AtomicU64,
    pub(super) wait_ns: AtomicU64,
    pub(super) transfer_ns: AtomicU64,
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

pub(super) struct Variable {
    pub(super) name: String,
    pub(super) dtype: DType,
    pub(super) layout: Layout,
    pub(super) logical: Logical,
    /// `starts[r]` is rank r's first global row; `starts[size]` the total.
    pub(super) starts: Vec<u64>,
    pub(super) metas: Vec<ShardMeta>,
    pub(super) routes: RwLock<Vec<Arc<Route>>>,
    pub(super) counters: Counters,
}

pub(super) struct Peer {
    pub(super) endpoint: Mutex<Endpoint>,
    /// PEER_CONNECTIONS connections to it, made on first use.
    pub(super) channel: Mutex<Option<Vec<Channel>>>,
}

/// TCP connections a reader keeps to each peer. One TCP stream carried about half of what two
/// do on the 2-core test VM (743-809 vs 398-458 us per MiB across two network namespaces, raw
/// sockets): requests are dealt over them and large answers split, so the kernel's work for
/// each stream can run on its own core at both ends.
pub(super) const PEER_CONNECTIONS: usize = 2;

/// Answers at least this large are split into one request per connection (smaller ones stay
/// one request: its round trip costs more than a second stream gains).
pub(super) const SPLIT_BYTES: usize = 8 << 20;

pub(super) struct ReaderInner {
    pub(super) rank: Option<usize>,
    pub(super) host: String,
    pub(super) rt: Rt,
    pub(super) peers: RwLock<Vec<Arc<Peer>>>,
    pub(super) vars: RwLock<HashMap<String, Arc<Variable>>>,
    pub(super) options: DistOptions,
    pub(super) timeout: Duration,
    /// This rank's own shards (a node's reader), read in place.
    pub(super) local: Option<Shards>,
    /// Pool for batches of store-backed shards staged before their rows are copied out.
    pub(super) staging: Allocator,
}

/// The read side of a distributed store: connections to every rank and the variables' shard
/// tables. Cheap to clone; [`DistReader::from_spec`] builds an independent one (own runtime,
/// own connections) for a forked worker or another thread.
#[derive(Clone)]
pub struct DistReader {
    pub(super) inner: Arc<ReaderInner>,
}

impl std::fmt::Debug for DistReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DistReader(rank {:?}, {} ranks)", self.inner.rank, self.inner.peers.read().map(|p| p.len()).unwrap_or(0))
    }
}

pub(super) fn lock_err<T>(_: T) -> Error {
    Error::invalid("store", "a distributed-store lock was poisoned by a panic".to_string())
}

impl DistReader {
    pub(super) fn with(rank: Option<usize>, options: DistOptions, local: Option<Shards>) -> Result<DistReader> {
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

    pub(super) fn set_endpoints(&self, endpoints: Vec<Endpoint>) -> Result<()> {
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
        let record_type = first.checked_type()?.clone();
        let mut starts = vec![0u64];
        for (r, m) in metas.iter().enumerate() {
            if m.rank != r {
                return Err(Error::invalid("shards", format!("shard {r} of '{name}' is rank {}'s", m.rank)));
            }
            if *m.checked_type()? != record_type {
                return Err(Error::ShapeMismatch {
                    expected: format!("rank 0's {record_type} records for '{name}'"),
                    found: format!("rank {r}'s {}", m.record_type),
                });
            }
            let next = starts[r].checked_add(m.rows).ok_or_else(|| Error::invalid("shards", format!("'{name}' has more than 2^64 rows")))?;
            starts.push(next);
        }
        let routes = (0..size).map(|r| self.route(name, &metas[r])).collect::<Result<Vec<_>>>()?;
        let RecordType { dtype, layout, logical } = record_type;
        let var = Variable { name: name.to_string(), dtype, layout, logical, starts, metas, routes: RwLock::new(routes), counters: Counters::default() };
        self.inner.vars.write().map_err(lock_err)?.insert(name.to_string(), Arc::new(var));
        Ok(())
    }

    /// How this reader reaches `meta`'s shard.
    pub(super) fn route(&self, name: &str, meta: &ShardMeta) -> Result<Arc<Route>> {
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
            (Some(fd), _) => match &meta.record_type.layout {
                Layout::Dense { item_shape } => SharedRows::open_peer(name, ep.pid, *fd, meta.rows, meta.record_type.dtype, item_shape.clone())
                    .map(|rows| Route::Shared { rows: Arc::new(rows), owner }),
                Layout::Ragged { .. } => Err(Error::invalid("shard", format!("rank {} shares ragged rows in memory; only dense rows are shared", meta.rank))),
            },
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

    pub(super) fn endpoint(&self, rank: usize) -> Result<Endpoint> {
        let peers = self.inner.peers.read().map_err(lock_err)?;
        let size = peers.len();
        let p = peers.get(rank).ok_or_else(|| Error::invalid("rank", format!("{rank} is not in a group of {size}")))?;
        let ep = p.endpoint.lock().map_err(lock_err)?.clone();
        Ok(ep)
    }

    pub(super) fn variable(&self, name: &str) -> Result<Arc<Variable>> {
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

    pub(super) fn channels(&self, rank: usize) -> Result<Vec<Channel>> {
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
    pub(super) fn refresh(&self, rank: usize) -> Result<bool> {
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
                Some(m) if m.rows == v.metas[rank].rows && m.record_type == v.metas[rank].record_type => m,
                _ => v.metas[rank].clone(),
            };
            let route = self.route(&v.name, &meta)?;
            v.routes.write().map_err(lock_err)?[rank] = route;
        }
        Ok(true)
    }
}

/// Wait until `f` exists (a file written atomically by another process) and read it.
pub(super) fn wait_for_file(f: &Path, deadline: Instant, what: &str) -> Result<Vec<u8>> {
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
