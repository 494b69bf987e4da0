//! One rank ([`DistNode`]): its shards, its Flight server, its reader.

#[allow(unused_imports)]
use super::*;

/// One rank of a distributed store: its shards, the Flight server that serves them, and a
/// reader of every variable. Collectives (exchanging endpoints and shard descriptions) are
/// the caller's: MPI, [`crate::dist::FileComm`], or threads in a test.
pub struct DistNode {
    pub(super) rank: usize,
    pub(super) size: usize,
    pub(super) shards: Shards,
    pub(super) owned: Mutex<HashMap<String, Arc<SharedRows>>>,
    pub(super) reader: DistReader,
    pub(super) endpoint: Endpoint,
    /// One stop signal per server thread.
    pub(super) stop: Mutex<Vec<tokio::sync::oneshot::Sender<()>>>,
}

/// Threads serving a rank's Flight server, each a runtime of its own accepting from the one
/// listener: a request is read, answered and written by one thread, with no hand-off between
/// runtime threads (a reader's connections to a rank spread over them).
pub(super) const SERVER_THREADS: usize = PEER_CONNECTIONS;

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
        let listener = std::net::TcpListener::bind(("0.0.0.0", 0)).map_err(|e| Error::io("0.0.0.0:0", e))?;
        listener.set_nonblocking(true).map_err(|e| Error::io("listener", e))?;
        let port = listener.local_addr().map_err(|e| Error::io("listener", e))?.port();
        let mut stop = Vec::with_capacity(SERVER_THREADS);
        for k in 0..SERVER_THREADS {
            let (tx, rx) = tokio::sync::oneshot::channel();
            let listener = listener.try_clone().map_err(|e| Error::io("listener", e))?;
            let service = ShardService { shards: shards.clone(), allocator: Allocator::default() };
            let rt = crate::io::runtime::build_current("zrecord-serve")?;
            std::thread::Builder::new()
                .name(format!("zrecord-serve-{k}"))
                .spawn(move || {
                    rt.block_on(async move {
                        // Registered with this thread's runtime; the same socket in every thread.
                        if let Ok(listener) = tokio::net::TcpListener::from_std(listener) {
                            flight::serve(service, listener, rx).await;
                        }
                    })
                })
                .map_err(|e| Error::io("server thread", e))?;
            stop.push(tx);
        }
        let host = options.host.clone().or_else(|| std::env::var("ZRECORD_DIST_HOST").ok()).or_else(first_ipv4).unwrap_or_else(|| "127.0.0.1".into());
        let endpoint = Endpoint { rank, addr: format!("{host}:{port}"), host: host_key(), pid: std::process::id() };
        if let Some(f) = options.file(&format!("node.{rank}")) {
            write_atomic(&f, &serde_json::to_vec(&endpoint).map_err(|e| Error::invalid("endpoint", e.to_string()))?)?;
        }
        Ok(DistNode { rank, size, shards, owned: Mutex::default(), reader, endpoint, stop: Mutex::new(stop) })
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

    pub(super) fn register(&self, name: &str, source: Arc<dyn RecordSource>, rows: Option<Arc<SharedRows>>) -> Result<()> {
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

    pub(super) fn publish_shard(&self, name: &str, meta: &ShardMeta) -> Result<()> {
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
        let meta = ShardMeta { rank: self.rank, rows, record_type: RecordType::dense(dtype, item_shape), fd: s.fd(), store: None };
        self.publish_shard(name, &meta)?;
        Ok(meta)
    }

    /// A shard served from any record source (a store or a view). `store`: the folder of a
    /// whole local store, which readers on this host open themselves instead of asking.
    pub fn add_source(&self, name: &str, source: Arc<dyn RecordSource>, store: Option<String>) -> Result<ShardMeta> {
        let meta = ShardMeta { rank: self.rank, rows: source.len(), record_type: source.record_type(), fd: None, store };
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
        if let Ok(mut stop) = self.stop.lock() {
            for tx in stop.drain(..) {
                let _ = tx.send(());
            }
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
