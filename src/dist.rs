//! Distributed store: rows of named variables sharded across processes and hosts, gathered
//! by global id (rank 0's rows first, then rank 1's, ...).
//!
//! - [`DistNode`]: one rank. Its shards are NumPy-like rows in shared memory ([`SharedRows`],
//!   a memfd) or any record source (a zrecord store or view); its Arrow Flight server answers
//!   `DoGet` tickets naming a variable and ids.
//! - [`DistReader`]: connections to every rank and each variable's shard table; a node has
//!   one, a forked worker or an extra member builds its own ([`DistReader::from_spec`],
//!   [`DistReader::join_group`]).
//! - [`DistSource`]: one variable as a [`crate::store::RecordSource`], so the loader, SQL and
//!   the Python views read it like a local store. A gather sends one request per owning rank
//!   (split past a size limit), all in flight together, while this rank's and same-host shards
//!   are read in place (shared memory or the store's own files: no copy on the owner's side).
//! - [`FileComm`]: file-based allgather / barrier for groups without MPI.
//!
//! Failures name the rank and variable: a rank that exited (seen through a pidfd on the same
//! host, a refused connection across hosts) or that does not answer within the timeout is an
//! [`crate::Error::Peer`], never a hang. With a rendezvous folder, a restarted rank publishes
//! its new endpoint and readers reconnect to it on their next failed request.

pub mod comm;
mod flight;
pub(crate) mod node;
mod shard;

pub use comm::FileComm;
#[doc(hidden)]
pub use flight::answer_ticket;
pub use node::{host_key, DistNode, DistOptions, DistReader, DistSource, Endpoint, Profile, ReaderSpec, ShardMeta, Transport};
pub use shard::SharedRows;
