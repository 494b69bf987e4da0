//! What ranks and readers exchange: endpoints, shard descriptions, options, reader specs.

#[allow(unused_imports)]
use super::*;

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
    /// What the shard's records are (every shard of a variable agrees).
    #[serde(flatten)]
    pub record_type: RecordType,
    /// The owner's memfd of shared rows (readers on its host map it).
    pub fd: Option<i32>,
    /// The store folder the owner serves (readers on its host open it).
    pub store: Option<String>,
}

impl ShardMeta {
    /// The record type, checked: ragged records have at least one dimension.
    pub(super) fn checked_type(&self) -> Result<&RecordType> {
        match self.record_type.layout {
            Layout::Ragged { ndim: 0 } => Err(Error::invalid("shard", format!("rank {} describes ragged records of 0 dimensions", self.rank))),
            _ => Ok(&self.record_type),
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
    pub(super) fn timeout(&self) -> Result<Duration> {
        if !(self.timeout_s.is_finite() && self.timeout_s > 0.0 && self.timeout_s < 1e7) {
            return Err(Error::invalid("timeout", format!("{} s; give a positive number of seconds", self.timeout_s)));
        }
        Ok(Duration::from_secs_f64(self.timeout_s))
    }

    pub(super) fn file(&self, what: &str) -> Option<PathBuf> {
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
