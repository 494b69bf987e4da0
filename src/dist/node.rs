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
use crate::store::{Batch, Ids, Layout, Logical, ReadOptions, RecordSource, RecordType, Store};

mod host;
mod reader;
mod server;
mod source;
mod wire;

#[allow(unused_imports)]
use self::{host::*, reader::*, server::*, source::*, wire::*};

pub use host::host_key;
pub use reader::{DistReader, Profile};
pub use server::DistNode;
pub(crate) use source::Out;
pub use source::DistSource;
pub use wire::{DistOptions, Endpoint, ReaderSpec, ShardMeta, Transport};
